package transfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// serveStreamsFor serves p's streams on loopback until the test ends and
// returns the address.
func serveStreamsFor(t *testing.T, p *transferPages) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.serveStreams(ctx, lis, tcp.DefaultSendBuffer) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve streams: %v", err)
		}
	})
	return lis.Addr().String()
}

// TestStreamsBesideTheFetch: with --streams every TCP READ cell prints
// both kinds of stream, each with one rate a measured round (the warm-up
// round's left out), its median, the fetch's share of it (of the medians,
// and round by round) and the client's CPU; the streams moved bytes; the
// table gives the stream into the destination as the bar.
func TestStreamsBesideTheFetch(t *testing.T) {
	b := smallTransferBench(t)
	b.Transports, b.Ops, b.Rounds, b.Streams = []string{"tcp"}, []string{"read"}, 2, true
	p := b.pages(true)
	addr := serveTransfer(t, p)
	b.StreamAddr = serveStreamsFor(t, p)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.client(ctx, &out, addr); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	line := regexp.MustCompile(`^stream \S+ × [12] \(inline cell\), into (the destination|one buffer): rounds ([0-9.]+) ([0-9.]+) Gbit/s, median ([0-9.]+); fetch [0-9]+% of it \(round by round [0-9]+ [0-9]+%, median [0-9]+%\); client [0-9.]+ cores`)
	n := 0
	for _, l := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(l, "stream ") {
			continue
		}
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("stream line not as expected: %q", l)
			continue
		}
		n++
		for _, r := range m[2:] {
			if v, _ := strconv.ParseFloat(r, 64); v <= 0 {
				t.Errorf("a stream round moved nothing: %q", l)
			}
		}
	}
	if want := len(b.Sizes) * len(b.Conns) * int(streamKinds); n != want {
		t.Fatalf("%d stream lines, want %d (each cell, each kind):\n%s", n, want, out.String())
	}
	checkStreamBar(t, out.String(), len(b.Sizes)*len(b.Conns))
}

// checkStreamBar checks that each of the want TCP READ rows of a matrix's
// table gives the stream into the destination (Gbit/s) and the fetch's
// share of it: the bar, as the row shows it.
func checkStreamBar(t *testing.T, out string, want int) {
	t.Helper()
	row := regexp.MustCompile(`^tcp\s+READ\s+\S+\s+\d+\s+\S+\s+[0-9.]+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9]+)%\s`)
	n := 0
	for _, l := range strings.Split(out, "\n") {
		m := row.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		n++
		fetch, _ := strconv.ParseFloat(m[1], 64)
		stream, _ := strconv.ParseFloat(m[2], 64)
		pct, _ := strconv.Atoi(m[3])
		if stream <= 0 {
			t.Errorf("row without a stream rate: %q", l)
		}
		if got := int(100*fetch/stream + 0.5); got < pct-2 || got > pct+2 { // both printed rounded
			t.Errorf("row %q: vs stream %d%%, its rates give %d%%", l, pct, got)
		}
	}
	if n != want {
		t.Fatalf("%d TCP READ rows with the stream bar, want %d:\n%s", n, want, out)
	}
}

// TestStreamOfAnUnservedSizeFails: a stream of a page size the serve side
// does not hold is ended at once and the client says so, within the round.
func TestStreamOfAnUnservedSizeFails(t *testing.T) {
	b := smallTransferBench(t)
	addr := serveStreamsFor(t, b.pages(true))
	dst := [][]byte{make([]byte, 8<<10)}
	n, err := readStream(context.Background(), addr, 8<<10, streamPool, dst, time.Now().Add(5*time.Second))
	if err == nil || !strings.Contains(err.Error(), "does not hold") {
		t.Fatalf("stream of 8 KiB pages: %d bytes, error %v; want a failure naming the size", n, err)
	}
	// The serve side closing the stream shows as a clean EOF before any
	// byte; a stream left open would end only by the client's own
	// deadline, with a timeout or closed-connection error instead.
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("stream ended after %d bytes with %v: want EOF before any byte (the serve side ends it at once)", n, err)
	}
}

// TestStreamReadsIntoEachPage: a stream into the destination fills page i
// with the served page i (the pages the fetch serves, from the same
// memory); into one buffer, only the first page's first chunk, with page 0.
func TestStreamReadsIntoEachPage(t *testing.T) {
	b := smallTransferBench(t)
	p := b.pages(true)
	addr := serveStreamsFor(t, p)
	size := uint64(16 << 10)
	for _, kind := range []streamKind{streamPool, streamHot} {
		dst := make([][]byte, b.pagesPer(size)) // as many as served: page i always lands in dst[i]
		for i := range dst {
			dst[i] = make([]byte, size)
		}
		if _, err := readStream(context.Background(), addr, size, kind, dst, time.Now().Add(300*time.Millisecond)); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		for i, d := range dst {
			want, wantFilled := p.data[transferKey(size, i)], kind == streamPool
			if kind == streamHot {
				want, wantFilled = p.data[transferKey(size, 0)], i == 0
			}
			if filled := bytes.Equal(d, want); filled != wantFilled {
				t.Errorf("%s: page %d holds the served page %d: %v, want %v", kind, i, i, filled, wantFilled)
			}
		}
	}
}

func TestStreamAddrIsTheNextPort(t *testing.T) {
	if a, err := streamAddrOf("10.79.3.1:7949"); err != nil || a != "10.79.3.1:7950" {
		t.Errorf("streamAddrOf(10.79.3.1:7949) = %q, %v; want 10.79.3.1:7950", a, err)
	}
	for _, bad := range []string{"10.79.3.1", "h:65535", "h:x", "h:0"} {
		if a, err := streamAddrOf(bad); err == nil {
			t.Errorf("streamAddrOf(%q) = %q, want an error", bad, a)
		}
	}
}

// TestPairedShares: each fetch round (GB/s) over the stream round after it
// (Gbit/s), in percent; rounds that do not pair give nothing.
func TestPairedShares(t *testing.T) {
	got := pairedShares([]float64{4, 5}, []float64{40, 50})
	if len(got) != 2 || got[0] != 80 || got[1] != 80 {
		t.Errorf("pairedShares(4 5 GB/s, 40 50 Gbit/s) = %v, want [80 80]", got)
	}
	if got := pairedShares([]float64{4}, []float64{40, 50}); got != nil {
		t.Errorf("unpaired rounds gave %v, want nil", got)
	}
}
