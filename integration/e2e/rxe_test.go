package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// The two guests of scripts/rdma/run.sh: their addresses on the qemu socket
// link, and the pages host-a saves and host-b loads.
var (
	guestAddr  = [2]string{"192.168.78.1", "192.168.78.2"}
	guestPages = 16
)

// TestTwoGuestsOverRealVerbs is one half of a two-host scenario over a real
// verbs stack: it runs inside the Soft-RoCE guests scripts/rdma/run.sh boots
// (`make test-rdma`), one per guest, ORBITKV_RXE_ROLE naming the half, and
// skips anywhere else. Each guest runs `orbitkv serve` with --rdma-devices
// rxe0 and the cluster's credentials (mutual TLS, made on the host). host-a
// saves guestPages pages of 128 KiB into DRAM; host-b sees RDMA chosen for
// host-a in `orbitkv peers`, loads them by RDMA READ and checks every byte
// against the same seeded generator, with no page carried over TCP; then it
// stops and leaves. host-a, once host-b has left, checks that it placed the
// pages for host-b and released the leases, and that its TCP data plane
// served nothing.
func TestTwoGuestsOverRealVerbs(t *testing.T) {
	role := os.Getenv("ORBITKV_RXE_ROLE")
	if role != "a" && role != "b" {
		t.Skip("runs inside the Soft-RoCE guests of scripts/rdma/run.sh (make test-rdma), ORBITKV_RXE_ROLE=a|b")
	}
	me := int(role[0] - 'a')
	certs := os.Getenv("ORBITKV_RXE_CERTS")
	name := hostName(me)
	args := []string{"--cluster-addr", guestAddr[me] + ":7946", "--node-name", name, "--rdma-devices", "rxe0",
		"--cluster-key-file", filepath.Join(certs, "gossip.key"), "--tls-ca", filepath.Join(certs, "ca.pem"),
		"--tls-cert", filepath.Join(certs, name+".pem"), "--tls-key", filepath.Join(certs, name+"-key.pem")}
	if me == 1 {
		waitFor(t, "host-a's gossip port", 10*time.Minute, func() bool {
			c, err := net.DialTimeout("tcp", guestAddr[0]+":7946", time.Second)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		args = append(args, "--cluster-join", guestAddr[0]+":7946")
	}
	p := startPeer(t, t.TempDir(), args...)
	if nics, ok := p.log.find("rdma: devices open; members with a device are reached over RDMA"); !ok {
		t.Fatalf("%s did not open rxe0: %v", name, p.log.withPrefix("rdma: "))
	} else {
		t.Logf("%s: rdma devices open: %v", name, nics["nics"])
	}
	shm, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "kv"), flash.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Close() })
	e := openEngine(t, p, shm)
	other := hostName(1 - me)
	waitFor(t, other+" over rdma in "+name+"'s peers", 5*time.Minute, func() bool {
		out, err := p.cli(t, "peers")
		return err == nil && transportIs(out, other, "rdma")
	})
	out, _ := p.cli(t, "peers")
	t.Logf("%s's peers:\n%s", name, out)
	if me == 0 {
		guestSave(t, p, e, shm)
	} else {
		guestLoad(t, p, e, shm)
	}
}

// guestKeys are the pages' keys and their source blocks, the same in both
// guests.
func guestKeys() ([][]byte, []*pb.PageRef) {
	r := rand.New(rand.NewPCG(36, 1))
	keys, refs := make([][]byte, guestPages), make([]*pb.PageRef, guestPages)
	for i := range keys {
		keys[i] = make([]byte, 16)
		for j := range keys[i] {
			keys[i][j] = byte(r.Uint32())
		}
		refs[i] = &pb.PageRef{Key: keys[i], Blocks: blocksOf(i)}
	}
	return keys, refs
}

// guestFill writes the seeded bytes host-a saves into shm.
func guestFill(shm *engineclient.Shm) {
	r := rand.New(rand.NewPCG(36, 2))
	for i := range shm.Mem {
		shm.Mem[i] = byte(r.Uint32())
	}
}

// guestSave is host-a's half: save the pages, wait for host-b to load them
// and leave, then check what this side saw.
func guestSave(t *testing.T, p *proc, e *engineProc, shm *engineclient.Shm) {
	guestFill(shm)
	_, refs := guestKeys()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mustAllOK(t)(e.Save(ctx, refs, pb.Durability_DURABILITY_DRAM))
	t.Logf("host-a saved %d pages of %d bytes", len(refs), len(pageBytes(shm, refs[0].Blocks)))
	waitFor(t, "host-b to load and leave", 10*time.Minute, func() bool {
		out, err := p.cli(t, "peers")
		return err == nil && !rowHas(out, "host-b ", "alive")
	})
	released, _ := scrapeSeries(t, p, `orbitkv_cluster_placement_leases_total{end="released"}`)
	served, _ := scrapeSeries(t, p, "orbitkv_cluster_served_pages_total")
	t.Logf("host-a: placement leases released %v; pages served over TCP %v", released, served)
	if released < 1 || served != 0 {
		t.Fatalf("host-a: %v leases released (want ≥ 1), %v pages served over TCP (want 0)", released, served)
	}
}

// guestLoad is host-b's half: find host-a's pages, load them by RDMA READ,
// check every byte, then stop (leaving the cluster).
func guestLoad(t *testing.T, p *proc, e *engineProc, shm *engineclient.Shm) {
	keys, src := guestKeys()
	waitLookup(t, e, keys, len(keys))
	dst := make([]*pb.PageRef, len(keys))
	for i := range keys {
		dst[i] = &pb.PageRef{Key: keys[i], Blocks: blocksOf(guestPages + i)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	mustAllOK(t)(e.Load(ctx, dst))
	took := time.Since(start)
	want, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "want"), flash.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	guestFill(want)
	wrong := 0
	for i := range keys {
		if !bytes.Equal(pageBytes(want, src[i].Blocks), pageBytes(shm, dst[i].Blocks)) {
			wrong++
		}
	}
	overTCP, _ := scrapeSeries(t, p, "orbitkv_cluster_rdma_fallback_pages_total")
	fallbacks, _ := scrapeSeries(t, p, "orbitkv_cluster_transport_fallbacks_total")
	t.Logf("host-b loaded %d pages in %v: %d wrong; pages over TCP %v; lane fallbacks %v", len(keys), took.Round(time.Millisecond), wrong, overTCP, fallbacks)
	t.Logf("host-b's cluster counters:\n%s", clusterSeries(t, p))
	if wrong != 0 || overTCP != 0 || fallbacks != 0 {
		t.Fatalf("host-b: %d wrong pages, %v pages over TCP, %v lane fallbacks (want 0, 0, 0)", wrong, overTCP, fallbacks)
	}
	p.stop(t)
}

// clusterSeries is the peer's orbitkv_cluster_ series, for the log.
func clusterSeries(t *testing.T, p *proc) string {
	t.Helper()
	var b strings.Builder
	for _, name := range []string{"orbitkv_cluster_fetched_pages_total", "orbitkv_cluster_member_transport"} {
		for _, line := range scrapeLines(t, p, name) {
			fmt.Fprintln(&b, line)
		}
	}
	return b.String()
}

// scrapeLines is every line of the peer's /metrics that starts with name.
func scrapeLines(t *testing.T, p *proc, name string) []string {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	var out []string
	for _, line := range strings.Split(body.String(), "\n") {
		if strings.HasPrefix(line, name) {
			out = append(out, line)
		}
	}
	return out
}

// transportIs says whether member's row in `orbitkv peers` output ends with
// the transport want (the reason, if any, comes after it: "tcp (rdma
// connecting)" is not "rdma").
func transportIs(out, member, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, member+" ") && strings.HasSuffix(strings.TrimSpace(l), " "+want) {
			return true
		}
	}
	return false
}
