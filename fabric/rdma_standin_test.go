//go:build cgo && linux

package fabric

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// TestClusterExchangesRDMAOverStandIn: two peers whose RDMA engines open
// rdma's STAND-IN libibverbs (rdma/testdata/standin_ibverbs.c: a memcpy
// model in this process, NOT HARDWARE) advertise a device, exchange their
// ConnInfo over the mutual-TLS peer service (ExchangeRDMA), connect, and
// then reach each other over RDMA in peers and metrics; a remote load on
// that route is byte-exact (the DRAM pool is not registered for RDMA yet,
// so the route carries its pages over TCP). Child process: a process holds
// one libibverbs. Needs cc and libibverbs-dev (skips without).
func TestClusterExchangesRDMAOverStandIn(t *testing.T) {
	if os.Getenv("ORBITKV_RDMA_STANDIN") != "" {
		clusterOverStandIn(t)
		return
	}
	cc, err := exec.LookPath("cc")
	if _, herr := os.Stat("/usr/include/infiniband/verbs.h"); err != nil || herr != nil {
		t.Skip("no C compiler or /usr/include/infiniband/verbs.h (libibverbs-dev): stand-in not built")
	}
	lib := filepath.Join(t.TempDir(), "libibverbs-standin.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, "../rdma/testdata/standin_ibverbs.c").CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in: %v\n%s", err, out)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterExchangesRDMAOverStandIn$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "ORBITKV_RDMA_STANDIN=1", "ORBITKV_LIBIBVERBS="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestClusterExchangesRDMAOverStandIn") {
		t.Fatalf("child over the stand-in: %v\n%s", err, out)
	}
	t.Logf("child over the stand-in (not hardware):\n%s", out)
}

func clusterOverStandIn(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{7}, 32))
	a := startPeer(t, clusterConfig(t, creds, ""))
	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	transportOf := func(tp *testPeer, self bool) (string, string) {
		resp, err := tp.admin.Peers(ctx(t), &pb.PeersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Peers {
			if p.Self == self {
				return p.Transport, p.TransportReason
			}
		}
		return "", ""
	}
	waitFor(t, "rdma both ways", 15*time.Second, func() bool {
		ta, _ := transportOf(a, false)
		tb, _ := transportOf(b, false)
		return ta == "rdma" && tb == "rdma"
	})
	if tr, why := transportOf(a, true); tr != "rdma" || why != "" {
		t.Fatalf("a's own transport: %s (%s)", tr, why)
	}
	bName := b.p.cluster.Name()
	if got := a.metric(`orbitkv_cluster_member_transport{member="` + bName + `",transport="rdma"}`); !strings.HasSuffix(got, " 1") {
		t.Fatalf("a's transport gauge for b: %q", got)
	}

	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(4)
	src := refs(keys, 0, 4)
	okOp(t)(ea.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	waitRemote(t, eb, keys, 4)
	dst := refs(keys, 32, 4)
	okOp(t)(eb.Load(ctx(t), dst))
	for i := range keys {
		if !bytes.Equal(ea.page(src[i].Blocks), eb.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs after a load on the rdma route", i)
		}
	}
	if got := b.metric(`orbitkv_cluster_transport_fallbacks_total`); !strings.HasSuffix(got, " 0") {
		t.Fatalf("fallbacks with the lane up: %q", got)
	}
}
