package deploy

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// want is what an operator relies on in one rendering.
type want struct {
	socketDir, dataDir string
	metricsPort        int
	ssdBytes           string // --ssd-bytes
	hugepages          string // hugepages-2Mi limit, "" for none
	cluster            bool
}

var defaults = want{socketDir: "/run/orbitkv", dataDir: "/var/lib/orbitkv", metricsPort: 9464, ssdBytes: "4GiB"}

func TestChartRendersWhatOperatorsRelyOn(t *testing.T) {
	serve := commandFlags(t, "serve")
	for name, tc := range map[string]struct {
		overrides string
		want      func(w *want)
	}{
		"defaults":     {},
		"ssd off":      {overrides: "flags: {ssd-bytes: \"0\"}", want: func(w *want) { w.ssdBytes = "0" }},
		"socket dir":   {overrides: "socketDir: /var/run/engines/kv", want: func(w *want) { w.socketDir = "/var/run/engines/kv" }},
		"metrics port": {overrides: "metrics: {port: 9500}", want: func(w *want) { w.metricsPort = 9500 }},
		"resources": {
			overrides: `
flags: {dram-bytes: 64GiB}
resources:
  requests: {cpu: "4", memory: 72Gi, hugepages-2Mi: 2Gi}
  limits: {memory: 72Gi, hugepages-2Mi: 2Gi}`,
			want: func(w *want) { w.hugepages = "2Gi" },
		},
		"numbers": {overrides: "flags: {ssd-queue-depth: 64, ssd-bytes: 4294967296}", want: func(w *want) { w.ssdBytes = "4294967296" }},
		"cluster": {
			overrides: "cluster: {enabled: true, tlsSecret: orbitkv-cluster}",
			want:      func(w *want) { w.cluster = true },
		},
		"data on a claim": {overrides: "dataDir: {volume: {persistentVolumeClaim: {claimName: orbitkv-data}}}", want: func(w *want) { w.dataDir = "" }},
	} {
		t.Run(name, func(t *testing.T) {
			w := defaults
			if tc.want != nil {
				tc.want(&w)
			}
			o, ds, c := renderDecode(t, tc.overrides)
			checkPod(t, ds, w)
			checkArgs(t, c, serve, w)
			checkProbes(t, c, w)
			checkResources(t, c, w)
			checkService(t, o, ds, w)
		})
	}
}

func checkPod(t *testing.T, ds *appsv1.DaemonSet, w want) {
	t.Helper()
	spec := &ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q: want host networking with cluster DNS", spec.HostNetwork, spec.DNSPolicy)
	}
	if !spec.HostIPC {
		t.Error("hostIPC false: the peer cannot open the engines' /dev/shm buffers or CUDA IPC handles")
	}
	c := &spec.Containers[0]
	sock := hostPathVolume(spec, "socket")
	if sock == nil || sock.Path != w.socketDir || mountPath(c, "socket") != w.socketDir {
		t.Errorf("socket volume %+v mounted at %q, want hostPath %s at the same path", sock, mountPath(c, "socket"), w.socketDir)
	}
	data := hostPathVolume(spec, "data")
	switch {
	case w.dataDir == "" && data != nil:
		t.Errorf("data volume is hostPath %s, want the configured volume", data.Path)
	case w.dataDir != "" && (data == nil || data.Path != w.dataDir):
		t.Errorf("data volume %+v, want hostPath %s", data, w.dataDir)
	}
	if mountPath(c, "data") != defaults.dataDir {
		t.Errorf("data mounted at %q, want %s", mountPath(c, "data"), defaults.dataDir)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Add, "IPC_LOCK") {
		t.Errorf("securityContext %s: want capability IPC_LOCK (locked memory)", yamlOf(t, sc))
	}
	if spec.ServiceAccountName == "" {
		t.Error("no serviceAccountName")
	}
}

func checkArgs(t *testing.T, c *corev1.Container, serve flagSet, w want) {
	t.Helper()
	if len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/orbitkv" || len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("runs %q %q, want /usr/local/bin/orbitkv serve ...", c.Command, c.Args)
	}
	args := expandEnv(c.Args[1:])
	if err := serve.check(args); err != nil {
		t.Errorf("orbitkv serve %s: %v", strings.Join(args, " "), err)
	}
	if err := acceptedByBinary(t, args); err != nil {
		t.Error(err)
	}
	wantArgs := map[string]string{
		"socket":       w.socketDir + "/orbitkv.sock",
		"data-dir":     defaults.dataDir,
		"metrics-addr": "0.0.0.0:" + strconv.Itoa(w.metricsPort),
		"ssd-bytes":    w.ssdBytes,
	}
	for name, v := range wantArgs {
		if got, _ := flagValue(args, name); got != v {
			t.Errorf("--%s=%q, want %q", name, got, v)
		}
	}
	_, tls := flagValue(args, "tls-cert")
	if _, gossip := flagValue(args, "cluster-addr"); gossip != w.cluster || tls != w.cluster {
		t.Errorf("cluster flags in %q, want cluster %v with mutual TLS", args, w.cluster)
	}
}

// expandEnv does what the kubelet does to $(NODE_IP) in arguments.
func expandEnv(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "$(NODE_IP)", "10.0.0.7")
	}
	return out
}

func checkProbes(t *testing.T, c *corev1.Container, w want) {
	t.Helper()
	for name, tc := range map[string]struct {
		p    *corev1.Probe
		path string
	}{
		"startup":   {c.StartupProbe, "/healthz"},
		"liveness":  {c.LivenessProbe, "/healthz"},
		"readiness": {c.ReadinessProbe, "/readyz"},
	} {
		if tc.p == nil || tc.p.HTTPGet == nil {
			t.Errorf("%s probe %s: want an HTTP GET of the metrics listener", name, yamlOf(t, tc.p))
			continue
		}
		g := tc.p.HTTPGet
		if g.Port.IntValue() != w.metricsPort || g.Host != "127.0.0.1" || g.Path != tc.path {
			t.Errorf("%s probe gets %s:%s%s, want 127.0.0.1:%d%s", name, g.Host, g.Port.String(), g.Path, w.metricsPort, tc.path)
		}
	}
	if c.StartupProbe != nil && c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold < 600 {
		t.Errorf("startup probe gives up after %d s: a start scans the whole SSD tier", c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold)
	}
}

func checkResources(t *testing.T, c *corev1.Container, w want) {
	t.Helper()
	pool, _ := flagValue(c.Args, "dram-bytes")
	n, err := sizeBytes(pool)
	if err != nil {
		t.Fatalf("--dram-bytes: %v", err)
	}
	limit := quantity(t, c.Resources.Limits, corev1.ResourceMemory)
	if limit.Value() <= int64(n) {
		t.Errorf("memory limit %s does not hold the %s DRAM pool (pre-faulted at start)", limit.String(), pool)
	}
	hp, ok := c.Resources.Limits["hugepages-2Mi"]
	if got := map[bool]string{true: hp.String()}[ok]; got != w.hugepages {
		t.Errorf("hugepages-2Mi limit %q, want %q", got, w.hugepages)
	}
}

func checkService(t *testing.T, o objects, ds *appsv1.DaemonSet, w want) {
	t.Helper()
	if len(o.services) != 1 || len(o.serviceAccounts) != 1 {
		t.Fatalf("%d Services, %d ServiceAccounts: want 1 each", len(o.services), len(o.serviceAccounts))
	}
	svc := o.services[0]
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service clusterIP %q, want headless", svc.Spec.ClusterIP)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, the pods carry %q", k, v, ds.Spec.Template.Labels[k])
		}
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, p.Name+"/"+strconv.Itoa(int(p.Port)))
	}
	if !slices.Contains(ports, "metrics/"+strconv.Itoa(w.metricsPort)) {
		t.Errorf("Service ports %v, want metrics/%d", ports, w.metricsPort)
	}
	if a := ds.Spec.Template.Annotations; a["prometheus.io/port"] != strconv.Itoa(w.metricsPort) || a["prometheus.io/scrape"] != "true" {
		t.Errorf("pod annotations %v, want prometheus.io/scrape on port %d", a, w.metricsPort)
	}
	if sa := o.serviceAccounts[0].Name; sa != ds.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("ServiceAccount %q, the pods use %q", sa, ds.Spec.Template.Spec.ServiceAccountName)
	}
	if w.cluster {
		join, _ := flagValue(ds.Spec.Template.Spec.Containers[0].Args, "cluster-join")
		if host, _, err := net.SplitHostPort(join); err != nil || !strings.HasPrefix(host, svc.Name+".") {
			t.Errorf("--cluster-join=%s, want the headless Service %s", join, svc.Name)
		}
	}
}

// TestChartRefusesBadValues: values that would run a broken peer, or that
// the chart would silently ignore, fail the rendering with a message naming
// the value (the templates' checks and values.schema.json).
func TestChartRefusesBadValues(t *testing.T) {
	for name, tc := range map[string]struct{ overrides, msg string }{
		"flag the chart owns": {"flags: {data-dir: /tmp}", "values.flags.data-dir"},
		"cluster without tls": {"cluster: {enabled: true}", "cluster.tlsSecret"},
		"misspelt key":        {"socketdir: /var/run/kv", "socketdir"},
		"misspelt nested key": {"metrics: {prot: 9500}", "prot"},
		"relative socket dir": {"socketDir: run/orbitkv", "socketDir"},
		"port out of range":   {"metrics: {port: 70000}", "port"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(t, tc.overrides)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("render: %v, want an error naming %s", err, tc.msg)
			}
		})
	}
}

var sizeMul = map[string]uint64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
	"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}

// sizeBytes reads a byte size as internal/bytesize does.
func sizeBytes(s string) (uint64, error) {
	if err := checkKind("value", s); err != nil {
		return 0, err
	}
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(s)
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	return n * sizeMul[strings.TrimSpace(s[i:])], err
}

// TestValuesFlagsAreServeFlags: every key of values.flags is an `orbitkv
// serve` flag, those left at "" (not passed by default) included.
func TestValuesFlagsAreServeFlags(t *testing.T) {
	serve := commandFlags(t, "serve")
	vals, err := chartutil.ReadValuesFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	flags, err := vals.Table("flags")
	if err != nil || len(flags) == 0 {
		t.Fatalf("values.flags: %v", err)
	}
	for name := range flags {
		if _, ok := serve[name]; !ok {
			t.Errorf("values.flags.%s: orbitkv serve has no flag --%s", name, name)
		}
	}
}
