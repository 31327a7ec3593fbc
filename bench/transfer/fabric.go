package transfer

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// FabricConfig is a `bench fabric` run: page fetches over the TCP data
// plane between two hosts (network namespaces on one machine,
// scripts/bench-fabric-netns.sh), from one DRAM pool into another, beside
// iperf3 on the same link in the same run, its rounds interleaved with ours
// as in bench transfer (baseline.go: -R, -P = streams and one process per
// stream, default and page-sized writes, the best median the baseline).
type FabricConfig struct {
	Serve     string  // serve synthetic pages on this address until interrupted
	Fetch     string  // fetch pages from a Serve side at this address
	Iperf3    string  // iperf3 server host for the baseline (empty: none)
	IperfPort int     // first port of the iperf3 servers (one per stream)
	PageBytes uint64  // page data bytes
	Pages     int     // pages the server holds
	Batch     int     // pages per fetch request
	Streams   int     // fetches in flight (connections)
	Rounds    int     // measured rounds
	Seconds   float64 // length of a round, seconds (whole beside iperf3)
}

// DefaultFabricConfig is `orbitkv bench fabric`'s default run (the side left to the caller).
func DefaultFabricConfig() FabricConfig {
	return FabricConfig{IperfPort: 5201, PageBytes: 2 << 20, Pages: 256, Batch: 32, Streams: 1, Rounds: 5, Seconds: 2}
}

// RunFabric runs cfg's side: the serve side until ctx ends, or the fetch
// side's rounds and table.
func RunFabric(ctx context.Context, cfg FabricConfig, out io.Writer) error {
	switch {
	case cfg.Serve != "":
		return benchFabricServe(ctx, out, cfg.Serve, cfg.PageBytes, cfg.Pages)
	case cfg.Fetch != "":
		if cfg.Iperf3 != "" && cfg.Seconds != float64(int(cfg.Seconds)) {
			return errors.New("bench fabric: --seconds must be whole beside iperf3 (its -t takes whole seconds)")
		}
		base := baseline{host: cfg.Iperf3, port: cfg.IperfPort}
		return benchFabricFetch(ctx, out, cfg.Fetch, base, cfg.PageBytes, cfg.Pages, cfg.Batch, cfg.Streams, cfg.Rounds, time.Duration(cfg.Seconds*float64(time.Second)))
	}
	return errors.New("bench fabric: give --serve ADDR or --fetch ADDR")
}

// benchPages are n pages of one size in a pre-faulted DRAM pool.
type benchPages struct {
	pool  *dram.Pool
	slots []dram.Slot
	wants []tcp.Want
	hdrs  map[pagekey.Key]page.Header
	index map[pagekey.Key]int
}

var benchLayout = pagekey.Fingerprint{'b', 'e', 'n', 'c', 'h'}

// benchKey is page i's key: both sides derive it, so no catalog is needed.
func benchKey(i int) pagekey.Key {
	var k pagekey.Key
	binary.LittleEndian.PutUint64(k[:], uint64(i)+1)
	copy(k[8:], "fabric")
	return k
}

func newBenchPages(pageBytes uint64, n int, fill bool) (*benchPages, error) {
	slab := max(64<<20, dram.SlotBytes(pageBytes))
	pool, err := dram.New(dram.Config{Bytes: (uint64(n)*dram.SlotBytes(pageBytes)/slab + 2) * slab, SlabBytes: slab})
	if err != nil {
		return nil, err
	}
	b := &benchPages{pool: pool, hdrs: map[pagekey.Key]page.Header{}, index: map[pagekey.Key]int{}}
	for i := range n {
		s, err := pool.Alloc(pageBytes)
		if err != nil {
			pool.Close()
			return nil, err
		}
		k := benchKey(i)
		b.slots = append(b.slots, s)
		b.wants = append(b.wants, tcp.Want{Key: k, Layout: benchLayout, Size: pageBytes})
		b.index[k] = i
		if fill {
			data := pool.Bytes(s)[:pageBytes]
			rand.Read(data)
			b.hdrs[k] = page.Header{Key: k, Layout: benchLayout, Length: pageBytes, Checksum: page.Checksum(data), Generation: 1}
		}
	}
	return b, nil
}

// Open serves the bench pages (tcp.Source).
func (b *benchPages) Open(_ context.Context, wants []tcp.Want) ([]tcp.Page, func()) {
	out := make([]tcp.Page, len(wants))
	for i, w := range wants {
		if j, ok := b.index[w.Key]; ok {
			out[i] = tcp.Page{Header: b.hdrs[w.Key], Data: b.pool.Bytes(b.slots[j])[:w.Size]}
		}
	}
	return out, func() {}
}

func benchFabricServe(ctx context.Context, out io.Writer, addr string, pageBytes uint64, n int) error {
	b, err := newBenchPages(pageBytes, n, true)
	if err != nil {
		return err
	}
	defer b.pool.Close()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := tcp.NewServer(b, nil)
	go func() { <-ctx.Done(); srv.Close() }()
	fmt.Fprintf(out, "serving %d pages of %d bytes on %s\n", n, pageBytes, lis.Addr())
	if err := srv.Serve(lis); !errors.Is(err, tcp.ErrServerClosed) {
		return err
	}
	return nil
}

// baseline is where the iperf3 servers of the baseline listen (host ""
// for none).
type baseline struct {
	host string
	port int
}

func benchFabricFetch(ctx context.Context, out io.Writer, addr string, iperf baseline, pageBytes uint64, n, batch, streams, rounds int, round time.Duration) error {
	dst, err := newBenchPages(pageBytes, n, false)
	if err != nil {
		return err
	}
	defer dst.pool.Close()
	c := tcp.NewClient(nil)
	defer c.Close()
	batch = min(batch, n)
	fmt.Fprintf(out, "bench fabric: %d pages of %d bytes at %s, %d per request, %d stream(s), %d rounds of %v\n",
		n, pageBytes, addr, batch, streams, rounds, round)
	var variants []iperfVariant
	var runIperf iperfRunner
	if iperf.host != "" {
		variants, runIperf = iperfVariants(pageBytes, streams), iperf3Against(iperf.host, iperf.port)
	}
	// The plan's round 0 is the warm-up: it opens the connections and
	// faults nothing new. iperf3's rounds alternate with ours (planCell).
	var rates []float64
	base := make([][]float64, len(variants))
	for _, st := range planCell(rounds, len(variants)) {
		if st.variant >= 0 {
			g, err := runIperf(ctx, variants[st.variant], round)
			if err != nil {
				return fmt.Errorf("iperf3 baseline: %w", err)
			}
			base[st.variant] = append(base[st.variant], g.gbps)
			fmt.Fprintf(out, "  round %d: iperf3 %s: %.1f Gbit/s\n", st.round, variants[st.variant], g.gbps)
			continue
		}
		d := round
		if st.round == 0 {
			d = round / 2
		}
		gb, err := fetchRound(ctx, c, addr, dst, batch, streams, d)
		if err != nil {
			return err
		}
		if st.round > 0 {
			rates = append(rates, gb)
			fmt.Fprintf(out, "  round %d: fetch %.2f GB/s (%.1f Gbit/s)\n", st.round, gb, gb*8)
		}
	}
	fetch := benchutil.Median(rates)
	fmt.Fprintf(out, "fetch (verified, into a DRAM pool): median %.2f GB/s = %.1f Gbit/s\n", fetch, fetch*8)
	if len(variants) == 0 {
		return nil
	}
	for i, v := range variants {
		fmt.Fprintf(out, "iperf3 -c %s -R, %s: median %.1f Gbit/s\n", iperf.host, v, benchutil.Median(base[i]))
	}
	best, gbit := bestBaseline(base)
	fmt.Fprintf(out, "fetch / iperf3 (best: %s): %.0f%%\n", variants[best], 100*fetch*8/gbit)
	return nil
}

// fetchRound fetches batches of pages on streams connections for d and
// returns the verified rate in GB/s.
func fetchRound(ctx context.Context, c *tcp.Client, addr string, dst *benchPages, batch, streams int, d time.Duration) (float64, error) {
	start := time.Now()
	before := c.ReceivedBytes()
	var wg sync.WaitGroup
	errc := make(chan error, streams)
	for s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s * batch; time.Since(start) < d; i += streams * batch {
				lo := i % len(dst.wants)
				hi := min(lo+batch, len(dst.wants))
				bufs := make([][]byte, hi-lo)
				for j := range bufs {
					bufs[j] = dst.pool.Bytes(dst.slots[lo+j])[:dst.wants[lo+j].Size]
				}
				fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				res := c.Fetch(fctx, addr, dst.wants[lo:hi], bufs)
				cancel()
				for _, r := range res {
					if r.Err != nil {
						errc <- r.Err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return 0, err
	default:
	}
	return benchutil.Gbps(c.ReceivedBytes()-before, time.Since(start)), nil
}
