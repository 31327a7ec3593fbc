package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
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

// The two guests of scripts/rdma/run.sh: their addresses on the first qemu
// socket link (rxe0's segment; rxe1 is on the second), their rxe devices'
// MTUs (run.sh gives a's netdevs 9000 bytes, b's 1500), the pages host-a
// saves and host-b loads (8 MiB: a READ long enough under TCG, about a
// second, for a fault to land in it), and the engine layout that holds
// them twice.
var (
	guestAddr  = [2]string{"192.168.78.1", "192.168.78.2"}
	guestMTU   = [2]int{4096, 1024}
	guestRXE   = []string{"rxe0", "rxe1"}
	guestPages = 64
	guestFlash = func() engineclient.Flash {
		f := flash
		f.NumBlocks = 2 * guestPages * f.PageTokens / f.BlockTokens
		return f
	}()
)

// TestTwoGuestsOverRealVerbs is one half of a two-host scenario over a real
// verbs stack: it runs inside the Soft-RoCE guests scripts/rdma/run.sh boots
// (`make test-rdma`), one per guest, ORBITKV_RXE_ROLE naming the half, and
// skips anywhere else. Each guest runs `orbitkv serve` with --rdma-devices
// rxe0,rxe1:1 (two devices, on two links; two QPs each) and the cluster's credentials
// (mutual TLS, made on the host); each checks it chose RoCE v2 GIDs and
// that its lanes run at the smaller end's MTU (the two guests' differ).
// host-a saves guestPages pages of 128 KiB into DRAM; host-b sees RDMA
// chosen for host-a in `orbitkv peers`, loads them by RDMA READ striped
// over both devices (each device's received packets move) and checks every
// byte against the same seeded generator, with no page carried over TCP; host-a
// checks that it placed the pages for host-b and released the leases, and
// that its TCP data plane served nothing. Then the faults over real verbs
// (rxe_faults_test.go): host-a's links down mid-READ and back, host-a's peer
// SIGKILLed mid-READ. Both peers log the GID they chose: a RoCE v2 one.
func TestTwoGuestsOverRealVerbs(t *testing.T) {
	role := os.Getenv("ORBITKV_RXE_ROLE")
	if role != "a" && role != "b" {
		t.Skip("runs inside the Soft-RoCE guests of scripts/rdma/run.sh (make test-rdma), ORBITKV_RXE_ROLE=a|b")
	}
	me := int(role[0] - 'a')
	certs := os.Getenv("ORBITKV_RXE_CERTS")
	name := hostName(me)
	args := []string{"--cluster-addr", guestAddr[me] + ":7946", "--node-name", name, "--rdma-devices", "rxe0,rxe1:1", "--rdma-qps-per-nic", "2",
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
		checkRoCEv2(t, name, me, nics["nics"])
	}
	shm, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "kv"), guestFlash.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Close() })
	e := openEngineAs(t, p, shm, guestFlash)
	keepAlive(t, e)
	other := hostName(1 - me)
	waitFor(t, other+" over rdma in "+name+"'s peers", 5*time.Minute, func() bool {
		out, err := p.cli(t, "peers")
		return err == nil && transportIs(out, other, "rdma")
	})
	out, _ := p.cli(t, "peers")
	t.Logf("%s's peers:\n%s", name, out)
	checkLanes(t, p, name, me)
	if me == 0 {
		guestSave(t, p, e, shm)
		_, refs := guestKeys()
		serveControl(t, p, func(i int) []byte { return pageBytesAs(shm, refs[i].Blocks, guestFlash) }, 8*time.Minute)
		return
	}
	defer control(t, "/done") // host-a's half ends with host-b's
	l := guestLoad(t, p, e, shm)
	control(t, "/clean")
	t.Run("link down mid-READ", l.linkDownMidRead)
	t.Run("corrupt in the holder's DRAM", l.corruptInHolderDRAM)
	t.Run("holder killed mid-READ", l.holderKilledMidRead)
	p.stop(t)
}

// checkRoCEv2 fails unless the start's log line names both rxe devices,
// each with the RoCE v2 GID the default chose (rxe's table holds each
// address as v1 and v2) and this guest's MTU.
func checkRoCEv2(t *testing.T, name string, me int, nics any) {
	t.Helper()
	list, _ := nics.([]any)
	if len(list) != len(guestRXE) {
		t.Fatalf("%s: want %v in the start's log line: %v", name, guestRXE, nics)
	}
	for i, n := range list {
		m, _ := n.(map[string]any)
		if m["Name"] != guestRXE[i] || m["GIDType"] != "RoCE v2" || m["GID"] == nil {
			t.Fatalf("%s: %v chose GID %v (index %v, %v), want %s with a RoCE v2 one", name, m["Name"], m["GID"], m["GIDIndex"], m["GIDType"], guestRXE[i])
		}
		t.Logf("%s: %v uses GID %v, index %v (%v), MTU %v", name, m["Name"], m["GID"], m["GIDIndex"], m["GIDType"], m["ActiveMTU"])
		if mtu, _ := m["ActiveMTU"].(float64); int(mtu) != guestMTU[me] {
			t.Fatalf("%s: %v's MTU is %v, want %d (run.sh sets this guest's netdevs' MTU)", name, m["Name"], m["ActiveMTU"], guestMTU[me])
		}
	}
}

// checkLanes fails unless the connection this peer dialed has two lanes per
// device, each to the same device on the member (the same link), up, at
// the smaller end's MTU: the ends' MTUs differ, and a lane run at the
// larger would lose every full-size packet the smaller end sends or gets.
func checkLanes(t *testing.T, p *proc, name string, me int) {
	t.Helper()
	line, ok := p.log.find("rdma: connected; member reached over RDMA")
	if !ok {
		t.Fatalf("%s logged no RDMA connection: %v", name, p.log.withPrefix("rdma: "))
	}
	lanes, _ := line["lanes"].([]any)
	want := min(guestMTU[0], guestMTU[1])
	if len(lanes) != 2*len(guestRXE) {
		t.Fatalf("%s: lanes %v, want two per device %v", name, line["lanes"], guestRXE)
	}
	for i, l := range lanes {
		m, _ := l.(map[string]any)
		mtu, _ := m["MTU"].(float64)
		dev := guestRXE[i/2]
		t.Logf("%s: lane %d %v → %v, path MTU %v (this end %d, the other %d)", name, i, m["NIC"], m["PeerNIC"], m["MTU"], guestMTU[me], guestMTU[1-me])
		if m["NIC"] != dev || m["PeerNIC"] != dev || m["Up"] != true || int(mtu) != want {
			t.Fatalf("%s: lane %d is %v, want %s to %s, up, at MTU %d", name, i, m, dev, dev, want)
		}
	}
}

// keepAlive keeps e's session open while the test runs (the peer closes a
// session silent for its keepalive, 10 s: the faults' waits are longer).
func keepAlive(t *testing.T, e *engineProc) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.KeepAlive(ctx, 2*time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
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

// guestFill writes the seeded bytes host-a saves into shm (eight at a
// time: TCG is slow).
func guestFill(shm *engineclient.Shm) {
	r := rand.New(rand.NewPCG(36, 2))
	for i := 0; i+8 <= len(shm.Mem); i += 8 {
		binary.LittleEndian.PutUint64(shm.Mem[i:], r.Uint64())
	}
}

// guestSave is host-a's half: save the pages (then serveControl answers
// host-b until it is done).
func guestSave(t *testing.T, p *proc, e *engineProc, shm *engineclient.Shm) {
	guestFill(shm)
	_, refs := guestKeys()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mustAllOK(t)(e.Save(ctx, refs, pb.Durability_DURABILITY_DRAM))
	t.Logf("host-a saved %d pages of %d bytes", len(refs), len(pageBytesAs(shm, refs[0].Blocks, guestFlash)))
}

// guestLoad is host-b's clean load: find host-a's pages, load them by RDMA
// READ, check every byte; it returns the loader the faults use.
func guestLoad(t *testing.T, p *proc, e *engineProc, shm *engineclient.Shm) *loader {
	keys, src := guestKeys()
	waitLookup(t, e, keys, len(keys))
	dst := make([]*pb.PageRef, len(keys))
	for i := range keys {
		dst[i] = &pb.PageRef{Key: keys[i], Blocks: blocksOf(guestPages + i)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rcvd := rxeReceived(t)
	start := time.Now()
	mustAllOK(t)(e.Load(ctx, dst))
	took := time.Since(start)
	after := rxeReceived(t)
	for i, dev := range guestRXE {
		t.Logf("host-b: striped: %s received %d packets for the load", dev, after[i]-rcvd[i])
		if after[i] == rcvd[i] {
			t.Errorf("host-b: %s received nothing: the READ was not striped over %v", dev, guestRXE)
		}
	}
	want, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "want"), guestFlash.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	guestFill(want)
	wantPages := make([][]byte, len(keys))
	wrong := 0
	for i := range keys {
		wantPages[i] = pageBytesAs(want, src[i].Blocks, guestFlash)
		if !bytes.Equal(wantPages[i], pageBytesAs(shm, dst[i].Blocks, guestFlash)) {
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
	return newLoader(t, p, e, shm, keys, dst, wantPages)
}

// rxeReceived is each rxe device's count of packets received (the kernel's
// hw_counters/rcvd_pkts), in guestRXE's order.
func rxeReceived(t *testing.T) []uint64 {
	t.Helper()
	out := make([]uint64, len(guestRXE))
	for i, dev := range guestRXE {
		n, err := readCounter("/sys/class/infiniband/" + dev + "/ports/1/hw_counters/rcvd_pkts")
		if err != nil {
			t.Fatalf("%s's received packets: %v", dev, err)
		}
		out[i] = n
	}
	return out
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
