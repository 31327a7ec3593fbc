package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// Plain TCP streams beside the fetch (--streams, on by default): the bar
// of the TCP data plane. Per TCP READ cell and round, after the fetch's
// round, the serve side writes on the cell's number of connections (writes
// of up to iperfMaxLen, as iperf3's -l) and the client reads
//   - the cell's pages in turn, from the memory the fetch serves them from,
//     into the cell's destinations, page after page (streamPool: the same
//     source and destination memory as the fetch, out of the caches as the
//     peer's pool is; the fetch is judged against this one), and
//   - page 0's first chunk again and again into one buffer of up to
//     iperfMaxLen a connection (streamHot: both ends in the caches, as
//     iperf3 sends and receives: what the link itself moves).
// The serve side's connections ask for the fetch server's send buffer
// (--serve-sndbuf). Nothing is framed or checked: these are ceilings, not
// transfers.

// streamKind is where a stream's client reads the bytes into.
type streamKind byte

const (
	streamPool streamKind = iota // every page in turn, into the cell's destinations
	streamHot                    // page 0's first chunk, into one buffer a connection
	streamKinds
)

func (k streamKind) String() string {
	if k == streamHot {
		return "into one buffer"
	}
	return "into the destination"
}

// streamRuns is one stream kind's rounds in a cell.
type streamRuns struct {
	rates          []float64 // Gbit/s per round
	client, server cpuUse
}

// streamChunk is the serve side's write size for pages of size.
func streamChunk(size uint64) uint64 { return min(size, iperfMaxLen) }

// streamAddrOf is the stream listener's address beside the fetch's at
// addr: the same host, the next port.
func streamAddrOf(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("bench transfer --streams: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p >= 65535 {
		return "", fmt.Errorf("bench transfer --streams: port %q: want 1…65534 (the streams use the next one)", port)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}

// streamRequestTimeout bounds how long a stream connection may take to
// name its page size, and each write's wait for the reader.
const streamRequestTimeout = 10 * time.Second

// listenStreams serves p's streams beside the fetch's listener at addr
// until the returned stop is called or ctx ends.
func (b *transferBench) listenStreams(ctx context.Context, out io.Writer, p *transferPages, addr string) (func(), error) {
	saddr, err := streamAddrOf(addr)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", saddr)
	if err != nil {
		return nil, fmt.Errorf("bench transfer --streams: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.serveStreams(ctx, lis, b.sendBuffer()) }()
	fmt.Fprintf(out, "streams on %s\n", lis.Addr())
	return func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintf(out, "streams: %v\n", err)
		}
	}, nil
}

// serveStreams answers stream connections on lis until ctx ends or lis
// fails: each names a page size and a streamKind (streamRequest) and is then
// written that size's pages until it goes away. Each connection asks for
// sndbuf bytes of send buffer, as the fetch's server does (0: autotuned).
func (p *transferPages) serveStreams(ctx context.Context, lis net.Listener, sndbuf int) error {
	go func() { <-ctx.Done(); lis.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Go(func() {
			defer conn.Close()
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			defer stop()
			if tc, ok := conn.(*net.TCPConn); ok && sndbuf > 0 {
				if err := tc.SetWriteBuffer(sndbuf); err != nil {
					return
				}
			}
			p.stream(conn)
		})
	}
}

// streamRequest is what a stream's client sends first: the page size
// (8 bytes, little-endian), then the streamKind (1 byte).
const streamRequest = 9

// stream writes one connection's stream: each page of the size in turn
// (streamPool), or page 0's first chunk again and again (streamHot). A size
// it does not serve, or an unknown kind, ends the connection at once.
func (p *transferPages) stream(conn net.Conn) {
	var req [streamRequest]byte
	conn.SetReadDeadline(time.Now().Add(streamRequestTimeout))
	if _, err := io.ReadFull(conn, req[:]); err != nil {
		return
	}
	size, kind := binary.LittleEndian.Uint64(req[:8]), streamKind(req[8])
	pages := p.pagesOf(size)
	if len(pages) == 0 || kind >= streamKinds {
		return
	}
	chunk := streamChunk(size)
	if kind == streamHot {
		pages = [][]byte{pages[0][:chunk]}
	}
	for i := 0; ; i++ {
		src := pages[i%len(pages)]
		for off := uint64(0); off < uint64(len(src)); off += chunk {
			conn.SetWriteDeadline(time.Now().Add(streamRequestTimeout))
			if _, err := conn.Write(src[off:min(off+chunk, uint64(len(src)))]); err != nil {
				return // the client is done (or gone)
			}
		}
	}
}

// pagesOf returns the held pages of size in index order (what the fetch
// serves them from); none if the size is not held.
func (p *transferPages) pagesOf(size uint64) [][]byte {
	var out [][]byte
	for i := 0; ; i++ {
		d, ok := p.data[transferKey(size, i)]
		if !ok || uint64(len(d)) != size {
			return out
		}
		out = append(out, d)
	}
}

// streamRound reads c.conns streams of c.size's page for one round, kind
// deciding where, and returns the rate in GB/s and the bytes read.
func (b *transferBench) streamRound(ctx context.Context, addr string, c *cell, kind streamKind, dst [][][]byte) (float64, uint64, error) {
	d := b.round()
	var read atomic.Uint64
	errs := make([]error, c.conns)
	var wg sync.WaitGroup
	start := time.Now()
	for s := range c.conns {
		wg.Go(func() {
			n, err := readStream(ctx, addr, c.size, kind, dst[s], start.Add(d))
			read.Add(n)
			errs[s] = err
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, fmt.Errorf("stream %s: %w", kind, err)
	}
	return benchutil.Gbps(read.Load(), elapsed), read.Load(), nil
}

// readStream dials one stream of size's pages and reads it into dst (each
// page in turn, or dst[0]'s first streamChunk bytes again and again) until
// end; it returns the bytes read.
func readStream(ctx context.Context, addr string, size uint64, kind streamKind, dst [][]byte, end time.Time) (uint64, error) {
	var dialer net.Dialer
	dctx, cancel := context.WithDeadline(ctx, end.Add(streamRequestTimeout))
	defer cancel()
	conn, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stop := context.AfterFunc(dctx, func() { conn.Close() })
	defer stop()
	conn.SetDeadline(end.Add(streamRequestTimeout))
	var req [streamRequest]byte
	binary.LittleEndian.PutUint64(req[:8], size)
	req[8] = byte(kind)
	if _, err := conn.Write(req[:]); err != nil {
		return 0, err
	}
	var n uint64
	for i := 0; time.Now().Before(end); i++ {
		buf := dst[0][:streamChunk(size)]
		if kind == streamPool {
			buf = dst[i%len(dst)]
		}
		m, err := io.ReadFull(conn, buf)
		n += uint64(m)
		if err != nil {
			return n, fmt.Errorf("after %s: %w (the serve side ends a stream whose page size it does not hold)", bytesize.Size(n), err)
		}
	}
	return n, nil
}

// measureStreams runs one round of each stream kind for cell c and, if
// keep (not a warm-up round), adds each round's rate and CPU to c.streams.
func (b *transferBench) measureStreams(ctx context.Context, c *cell, dst [][][]byte, keep bool) error {
	for k := range streamKinds {
		m := startCPUMeter(b.ServePID)
		rate, n, err := b.streamRound(ctx, b.StreamAddr, c, k, dst)
		if err != nil {
			return err
		}
		if !keep {
			continue
		}
		r := &c.streams[k]
		m.stopInto(&r.client, &r.server, float64(n))
		r.rates = append(r.rates, rate*8)
	}
	return nil
}

// printStreams writes, per cell with streams, each kind's rounds and
// median beside the fetch and the iperf3 baseline, and the client's CPU.
func printStreams(out io.Writer, cells []cell) {
	header := false
	for _, c := range cells {
		for k := range streamKinds {
			r := c.streams[k]
			if len(r.rates) == 0 {
				continue
			}
			if !header {
				fmt.Fprintln(out, "streams per cell: into the destination (the bar: the cell's pages in turn, same source and destination memory as the fetch), into one buffer (one chunk again and again, both ends in the caches, as iperf3)")
				header = true
			}
			m := benchutil.Median(r.rates)
			line := fmt.Sprintf("stream %s × %d (%s cell), %s: rounds %s Gbit/s, median %.1f; fetch %.0f%% of it",
				bytesize.Size(c.size), c.conns, c.verifyLabel(), k, fmtRates(r.rates), m, 100*c.gbps*8/m)
			if p := pairedShares(c.rounds, r.rates); len(p) > 0 {
				line += fmt.Sprintf(" (round by round %s%%, median %.0f%%)", fmtShares(p), benchutil.Median(p))
			}
			if _, base := bestBaseline(c.baseRates); base > 0 {
				line += fmt.Sprintf("; it %.0f%% of iperf3", 100*m/base)
			}
			fmt.Fprintf(out, "%s; client %s, server %s\n", line, r.client.cost(), r.server.cost())
		}
	}
}

// pairedShares is each measured round's fetch rate (GB/s) as a percentage
// of the stream round that ran right after it (Gbit/s): paired, so that
// drift on a shared machine lands on both sides of each ratio alike.
func pairedShares(fetch, stream []float64) []float64 {
	if len(fetch) != len(stream) {
		return nil
	}
	out := make([]float64, 0, len(fetch))
	for i, f := range fetch {
		if stream[i] > 0 {
			out = append(out, 100*f*8/stream[i])
		}
	}
	return out
}

func fmtShares(p []float64) string {
	s := make([]string, len(p))
	for i, x := range p {
		s[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(s, " ")
}
