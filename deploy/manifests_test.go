package deploy

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite k8s/ from the chart's rendering with default values")

const manifestsDir = "k8s"

const manifestHeader = "# Rendered from deploy/helm/orbitkv with its default values (release orbitkv,\n" +
	"# namespace orbitkv). Do not edit: change the chart, then run\n" +
	"#   cd deploy && go test -run TestManifestsMatchChart -update\n"

// TestManifestsMatchChart keeps the plain manifests identical to the
// chart's rendering with default values, so the two never drift.
func TestManifestsMatchChart(t *testing.T) {
	files, err := render(t, "")
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	want := map[string]string{}
	for name, text := range files {
		want[filepath.Base(name)] = manifestHeader + strings.TrimLeft(text, "\n")
	}
	if *update {
		writeManifests(t, want)
	}
	have, err := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range have {
		if _, ok := want[filepath.Base(path)]; !ok {
			t.Errorf("%s is not rendered by the chart: remove it or run -update", path)
		}
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		got, err := os.ReadFile(filepath.Join(manifestsDir, name))
		if err != nil {
			t.Errorf("%v (run -update)", err)
			continue
		}
		if string(got) != want[name] {
			t.Errorf("%s/%s differs from the chart's rendering: run go test -run TestManifestsMatchChart -update", manifestsDir, name)
		}
	}
	if _, err := decode(want); err != nil {
		t.Errorf("decode manifests: %v", err)
	}
}

func writeManifests(t *testing.T, want map[string]string) {
	t.Helper()
	old, _ := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	for _, path := range old {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(manifestsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range want {
		if err := os.WriteFile(filepath.Join(manifestsDir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
