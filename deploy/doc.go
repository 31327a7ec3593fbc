// Package deploy holds OrbitKV's deployment files and their tests: the Helm
// chart (helm/orbitkv), the plain Kubernetes manifests rendered from it
// (k8s/), the systemd unit (systemd/), the Dockerfile (docker/) and the
// Grafana dashboards (grafana/). It is a Go module of its own so that Helm's
// and Kubernetes' packages stay out of the peer's go.mod.
//
// The tests need no network and no cluster:
//
//  1. The chart renders with Helm's own packages, for the default values and
//     variants, and every manifest decodes strictly (an unknown field is an
//     error) into the k8s.io/api types.
//  2. k8s/ is the chart's rendering with default values, byte for byte
//     (go test -run TestManifestsMatchChart -update rewrites it).
//  3. The arguments the DaemonSet, its probes and the systemd unit run are
//     flags the real binary accepts, with values of the flag's type: the
//     tests build orbitkv into a temporary directory (or take ORBITKV_BIN) and read `--help`.
//  4. Every PromQL expression in the dashboards names only series a running
//     peer exports, with label matchers some exported series satisfies.
package deploy
