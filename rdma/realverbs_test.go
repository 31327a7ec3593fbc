//go:build cgo && linux

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRealVerbsLoopback runs READ (scattered) and WRITE (gathered) through
// real libibverbs and a real device: two engines on the same NICs,
// connected through them. It skips where there is no device, saying so;
// ORBITKV_REQUIRE=rdma makes that a failure. ORBITKV_RDMA_DEVICES names the
// allowlist (e.g. a soft-RoCE rxe0).
func TestRealVerbsLoopback(t *testing.T) {
	allow, err := ParseDevices(os.Getenv("ORBITKV_RDMA_DEVICES"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Devices: allow, GIDIndex: -1}
	e, err := Open(cfg)
	if errors.Is(err, ErrNoDevice) && !strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "rdma") {
		t.Skipf("no RDMA device here: %v", err)
	}
	var nics []NIC
	if err == nil {
		// The default GID is RoCE v2 wherever sysfs gives types (rxe's
		// table has each address as v1 and as v2).
		nics = e.NICs()
		for _, n := range nics {
			t.Logf("%s port %d: GID %d %s (%v), MTU %d", n.Name, n.Port, n.GIDIndex, n.GID, n.GIDType, n.ActiveMTU)
			if n.GIDType != GIDTypeRoCEv2 && strings.HasPrefix(n.Name, "rxe") {
				t.Errorf("%s: the default chose GID %d of type %v, want RoCE v2", n.Name, n.GIDIndex, n.GIDType)
			}
		}
		e.Close()
	}
	before := sentPackets(t, nics)
	loopbackScenario(t, cfg)
	if len(nics) > 1 { // striped: every device sent its share
		after := sentPackets(t, nics)
		for _, n := range nics {
			t.Logf("striped: %s sent %d packets", n.Name, after[n.Name]-before[n.Name])
			if after[n.Name] == before[n.Name] {
				t.Errorf("%s sent no packet: the lanes were not striped over every device", n.Name)
			}
		}
	}
}

// sentPackets is each NIC's count of packets sent, from the kernel's
// counters in sysfs (rxe: hw_counters/sent_pkts; others: the port's
// port_xmit_packets). A device with neither fails the test.
func sentPackets(t *testing.T, nics []NIC) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, n := range nics {
		port := fmt.Sprintf("/sys/class/infiniband/%s/ports/%d/", n.Name, n.Port)
		var v uint64
		var err error
		for _, f := range []string{"hw_counters/sent_pkts", "counters/port_xmit_packets"} {
			var b []byte
			if b, err = os.ReadFile(port + f); err == nil {
				_, err = fmt.Sscan(string(b), &v)
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: no packet counter in %s: %v", n.Name, port, err)
		}
		out[n.Name] = v
	}
	return out
}

// loopbackScenario connects two engines on cfg's devices and moves bytes
// both ways through the binding, checking every byte.
func loopbackScenario(t *testing.T, cfg Config) {
	a, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Logf("NICs: %+v", a.NICs())
	ma, mb := mmapT(t, 4<<20), mmapT(t, 4<<20)
	fillRandom(mb, 11)
	ra, err := a.RegisterHost("a", ma, LocalOnly)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.RegisterHost("b", mb, RemoteRead|RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := a.Dial(ctx, func(_ context.Context, info ConnInfo) (ConnInfo, error) {
		wire, err := info.Marshal()
		if err != nil {
			return ConnInfo{}, err
		}
		in, err := UnmarshalConnInfo(wire)
		if err != nil {
			return ConnInfo{}, err
		}
		reply, _, err := b.Accept(in)
		return reply, err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lanes: %+v", c.Lanes())
	// READ: 16 pages of 64 KiB, each scattered over three segments.
	page := uint64(64 << 10)
	var ops []Op
	for i := range uint64(16) {
		base := (15 - i) * page
		ops = append(ops, Op{Remote: rb.Key, RemoteOff: i * page, Local: []Segment{{ra, base + page/2, page / 2}, {ra, base, page / 4}, {ra, base + page/4, page / 4}}})
	}
	start := time.Now()
	if err := errors.Join(c.Read(ctx, ops)...); err != nil {
		t.Fatalf("read: %v", err)
	}
	t.Logf("read 1 MiB in %v", time.Since(start))
	for i, o := range ops {
		var got []byte
		for _, s := range o.Local {
			got = append(got, ma[s.Off:s.Off+s.Len]...)
		}
		if !bytes.Equal(got, mb[o.RemoteOff:o.RemoteOff+page]) {
			t.Fatalf("read op %d: bytes differ", i)
		}
	}
	// WRITE: gather A's first 1 MiB into B at 2 MiB.
	fillRandom(ma[:1<<20], 12)
	w := []Op{{Remote: rb.Key, RemoteOff: 2 << 20, Local: []Segment{{ra, 512 << 10, 512 << 10}, {ra, 0, 512 << 10}}}}
	if err := errors.Join(c.Write(ctx, w)...); err != nil {
		t.Fatalf("write: %v", err)
	}
	want := append(append([]byte{}, ma[512<<10:1<<20]...), ma[:512<<10]...)
	if !bytes.Equal(mb[2<<20:3<<20], want) {
		t.Fatal("write: bytes differ")
	}
	// An op outside what B offers fails alone at the NIC (remote access).
	bad := []Op{{Remote: rb.Key, RemoteOff: 0, Local: []Segment{{ra, 0, 4096}}}, ops[0]}
	c.remote[rb.Key] = RemoteRegion{Key: rb.Key, Addr: rb.Addr, Len: rb.Len + 4096, RKeys: append([]uint32{}, c.remote[rb.Key].RKeys...)}
	bad[0].RemoteOff = rb.Len // past B's MR: the responder refuses it
	errs := c.Read(ctx, bad)
	t.Logf("past the remote MR: %v; the other op: %v; stats %+v", errs[0], errs[1], a.Stats())
	var ce *CompletionError
	if !errors.As(errs[0], &ce) || ce.Status != WCRemAccessErr {
		t.Fatalf("READ past the remote MR: %v, want a remote access error completion", errs[0])
	}
	// The lane broke; the next batch reconnects it and works again.
	clear(ma)
	if err := errors.Join(c.Read(ctx, ops[:2])...); err != nil {
		t.Fatalf("read after the error: %v", err)
	}
	// One lane per device broke (the op was retried on another); each
	// reconnected once.
	if r := a.Stats().Reconnects; !bytes.Equal(ma[15*page:15*page+page/4], mb[page/2:page*3/4]) || r < 1 || r > uint64(len(c.Lanes())) {
		t.Fatalf("after recovery: bytes or reconnects wrong (stats %+v)", a.Stats())
	}
}

func mmapT(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}
