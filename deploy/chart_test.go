package deploy

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/orbitkv"

// The release the plain manifests in k8s/ are rendered as.
var defaultRelease = chartutil.ReleaseOptions{Name: "orbitkv", Namespace: "orbitkv", IsInstall: true, Revision: 1}

// render renders the chart with overrides (YAML, as a -f file would hold)
// and returns each template's output by file name (templates/x.yaml), the
// helpers, NOTES.txt and empty outputs left out, as Helm installs them.
func render(t *testing.T, overrides string) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals, err := chartutil.ReadValues([]byte(overrides))
	if err != nil {
		t.Fatalf("overrides: %v", err)
	}
	return renderChart(ch, vals)
}

func renderChart(ch *chart.Chart, vals chartutil.Values) (map[string]string, error) {
	top, err := chartutil.ToRenderValues(ch, vals, defaultRelease, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Engine{Strict: true}.Render(ch, top)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for name, text := range out {
		base := strings.TrimPrefix(name, ch.Name()+"/")
		if strings.HasSuffix(base, ".tpl") || strings.HasSuffix(base, "NOTES.txt") || strings.TrimSpace(text) == "" {
			continue
		}
		files[base] = text
	}
	return files, nil
}

// objects is one rendering decoded: the manifests by kind.
type objects struct {
	daemonSets      []appsv1.DaemonSet
	services        []corev1.Service
	serviceAccounts []corev1.ServiceAccount
}

// decode decodes every manifest of a rendering strictly into its API type:
// an unknown or misspelt field, or a value of the wrong type, is an error.
func decode(files map[string]string) (objects, error) {
	var o objects
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		for i, doc := range splitDocs(files[name]) {
			if err := o.add(doc); err != nil {
				return o, fmt.Errorf("%s, document %d: %w", name, i, err)
			}
		}
	}
	return o, nil
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func splitDocs(text string) []string {
	var docs []string
	for _, d := range docSep.Split(text, -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func (o *objects) add(doc string) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return fmt.Errorf("type: %w", err)
	}
	strict := func(v any) error { return yaml.UnmarshalStrict([]byte(doc), v) }
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 DaemonSet":
		var v appsv1.DaemonSet
		if err := strict(&v); err != nil {
			return err
		}
		o.daemonSets = append(o.daemonSets, v)
	case "v1 Service":
		var v corev1.Service
		if err := strict(&v); err != nil {
			return err
		}
		o.services = append(o.services, v)
	case "v1 ServiceAccount":
		var v corev1.ServiceAccount
		if err := strict(&v); err != nil {
			return err
		}
		o.serviceAccounts = append(o.serviceAccounts, v)
	default:
		return fmt.Errorf("unexpected %s %s: add it to the test's types", tm.APIVersion, tm.Kind)
	}
	return nil
}

// renderDecode renders and decodes, failing the test on either error, and
// returns the one DaemonSet's peer container with the rest.
func renderDecode(t *testing.T, overrides string) (objects, *appsv1.DaemonSet, *corev1.Container) {
	t.Helper()
	files, err := render(t, overrides)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o, err := decode(files)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if len(o.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(o.daemonSets))
	}
	ds := &o.daemonSets[0]
	if n := len(ds.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	return o, ds, &ds.Spec.Template.Spec.Containers[0]
}

// flagValue is the value of --name in args ("", false when absent).
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func hostPathVolume(spec *corev1.PodSpec, name string) *corev1.HostPathVolumeSource {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v.HostPath
		}
	}
	return nil
}

func mountPath(c *corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

func yamlOf(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.TrimSpace(b))
}

// quantity parses a Kubernetes quantity from the rendering.
func quantity(t *testing.T, rl corev1.ResourceList, name corev1.ResourceName) resource.Quantity {
	t.Helper()
	q, ok := rl[name]
	if !ok {
		t.Fatalf("no %s in %v", name, rl)
	}
	return q
}
