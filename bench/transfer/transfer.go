package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer/tcp"
	"golang.org/x/sys/unix"
)

// bench transfer: a matrix of transport (tcp; rdma where a device exists)
// × READ/WRITE × payload size × connections, every transfer's bytes checked
// against the checksum the receiving side computed itself from the page's
// deterministic contents, TCP beside iperf3 on the same link. --netns runs
// it between two network namespaces joined by a veth pair that it makes
// and removes; --serve/--client run the two sides by hand.
type transferBench struct {
	Transports []string
	Ops        []string
	Sizes      []uint64
	Conns      []int
	Verify     []string // TCP only: where the client checksums pages (tcp.Verify's names: "inline", "behind", "auto")
	Seconds    float64
	Rounds     int
	BatchBytes uint64 // bytes per request (pages = BatchBytes / size, at least 1)
	PoolBytes  uint64 // bytes of pages each side holds per size
	RDMA       rdma.Config
	// Baseline, if set, runs one iperf3 round; each TCP READ cell then
	// interleaves its rounds with the baseline's (baseline.go).
	Baseline iperfRunner
	// PrefetchBytes is the serve side's tcp.Server.PrefetchBytes; negative
	// leaves the server's own default.
	PrefetchBytes int
	// Splice is the serve side's tcp.Server.Splice.
	Splice bool
	// SendBuffer is the serve side's tcp.Server.SendBuffer; negative
	// leaves the server's own default.
	SendBuffer int
	// ServePID, if set, is the --serve process on this machine, whose CPU
	// time each TCP cell reports beside the client's (cpu.go).
	ServePID int
	// Streams adds plain TCP streams to each TCP READ cell, served at
	// StreamAddr (stream.go; the client's default: the fetch's host, the
	// next port): the one into the destination is the cell's bar.
	Streams    bool
	StreamAddr string
}

// Config is a `bench transfer` run: the side (Netns, or Serve and Client
// by hand) and the matrix. The lists are comma-separated, as the flags give
// them; Run parses and checks them.
type Config struct {
	Netns      bool   // make two network namespaces and run both sides and iperf3 in them (root)
	SplitCPUs  bool   // with Netns: each namespace's processes on its own half of the CPUs
	RPS        bool   // with Netns and SplitCPUs: each veth's received packets on its namespace's CPUs
	Serve      string // serve the matrix's pages over TCP on this address until ctx ends
	Client     string // run the matrix against a Serve side at this address
	Iperf3     string // iperf3 server host for the baseline (with Client; Netns starts its own)
	Iperf3Port int    // first port of the iperf3 servers (one per connection)
	Transports string // transports to measure: tcp, rdma
	Ops        string // operations to measure: read, write
	Sizes      string // payload (page) sizes
	Conns      string // connections (parallel streams; iperf3 -P)
	Verify     string // where the TCP client checksums each page: inline, behind, auto, default
	CPUProfile string // write each side's Go CPU profile to PREFIX.serve.pprof and PREFIX.client.pprof
	// Args is the command line: under Netns both sides run `orbitkv bench
	// transfer` again with its matrix flags, so the flags are the bench's
	// wire format between its sides.
	Args []string
	transferBench
}

// DefaultConfig is `orbitkv bench transfer`'s default matrix (the side left to the caller).
func DefaultConfig() Config {
	c := Config{Iperf3Port: 5201, Transports: "tcp,rdma", Ops: "read,write", Sizes: "256KiB,2MiB", Conns: "1,2", Verify: "default"}
	c.Seconds, c.Rounds, c.PrefetchBytes, c.Streams, c.SendBuffer = 1, 3, -1, true, -1
	c.BatchBytes, c.PoolBytes = 16<<20, 64<<20
	c.RDMA.GIDIndex = -1
	return c
}

// RegisterFlags registers the bench's flags on fs, into c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Netns, "netns", c.Netns, "make two network namespaces joined by a veth pair, run both sides and iperf3 in them, remove them at the end (root)")
	fs.BoolVar(&c.SplitCPUs, "split-cpus", c.SplitCPUs, "with --netns: run each namespace's processes (OrbitKV's and iperf3's) on its own half of the CPUs, as two hosts would; default: both share every CPU")
	fs.BoolVar(&c.RPS, "rps", c.RPS, "with --netns --split-cpus: process each veth's received packets on its own namespace's CPUs (rps_cpus), as two hosts would; default: on the sending CPU, as veth does")
	fs.StringVar(&c.Serve, "serve", c.Serve, "serve the matrix's pages over TCP on this address until interrupted")
	fs.StringVar(&c.Client, "client", c.Client, "run the matrix against a --serve side at this address")
	fs.StringVar(&c.Iperf3, "iperf3", c.Iperf3, "iperf3 server host for the baseline (with --client; --netns starts its own)")
	fs.IntVar(&c.Iperf3Port, "iperf3-port", c.Iperf3Port, "first port of the iperf3 servers (one per connection of the largest --conns: port, port+1, …)")
	fs.StringVar(&c.Transports, "transports", c.Transports, "transports to measure")
	fs.StringVar(&c.Ops, "ops", c.Ops, "operations to measure")
	fs.StringVar(&c.Sizes, "sizes", c.Sizes, "payload (page) sizes")
	fs.StringVar(&c.Conns, "conns", c.Conns, "connections (parallel streams; iperf3 -P)")
	fs.StringVar(&c.Verify, "verify", c.Verify, "where the TCP client checksums each page: inline (the reading goroutine, after each read), behind (a goroutine of its own, behind the reads), auto (behind while another fetch is under way, else inline), default (the client's own choice: auto with 4 or more cores, else inline); several: inline,behind,auto")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write each side's Go CPU profile to PREFIX.serve.pprof and PREFIX.client.pprof (with --netns: both sides')")
	fs.Float64Var(&c.Seconds, "seconds", c.Seconds, "length of one measured round (whole seconds with an iperf3 baseline: iperf3 -t takes whole seconds)")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "measured rounds per cell (median reported)")
	fs.IntVar(&c.PrefetchBytes, "serve-prefetch", c.PrefetchBytes, "bytes the serve side reads each answer's pages ahead of its writes, on a goroutine of the request's own (0: off; -1: the server's default, on with 4 or more cores)")
	fs.BoolVar(&c.Streams, "streams", c.Streams, "beside each TCP READ cell's rounds, bare TCP streams on the next port (no header, no check): the cell's pages from the memory the fetch serves them from into its destinations, the bar the fetch is judged against (vs stream); and one page's chunk into one buffer, as iperf3 moves it")
	fs.IntVar(&c.SendBuffer, "serve-sndbuf", c.SendBuffer, "bytes of send buffer the serve side's connections ask for (SO_SNDBUF; 0: the kernel's autotuning; -1: the server's default, tcp.DefaultSendBuffer)")
	fs.BoolVar(&c.Splice, "serve-splice", c.Splice, "the serve side writes page bytes by reference (vmsplice and splice), each answer's pages held until the client's next request (tcp.Server.Splice)")
	fs.IntVar(&c.ServePID, "serve-pid", c.ServePID, "with --client: the --serve side's process id on this machine, whose CPU the matrix reports beside the client's and iperf3's (--netns passes it)")
	fs.Var((*bytesize.Size)(&c.BatchBytes), "batch-bytes", "bytes per request")
	fs.Var((*bytesize.Size)(&c.PoolBytes), "pool-bytes", "bytes of pages the serve side holds per size (4 to 4096 pages)")
	c.RDMA.RegisterFlags(fs) // --rdma-devices (the NIC allowlist), --rdma-gid-index, …
}

// Run checks cfg and runs its side: both in namespaces (Netns), the serve
// side until ctx ends, or the client's matrix and tables.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	b := cfg.transferBench
	if err := b.parse(cfg.Transports, cfg.Ops, cfg.Sizes, cfg.Conns); err != nil {
		return err
	}
	if err := b.parseVerify(cfg.Verify); err != nil {
		return err
	}
	if err := checkNetnsFlags(cfg.Netns, cfg.SplitCPUs, cfg.RPS); err != nil {
		return err
	}
	if cfg.Netns || cfg.Iperf3 != "" {
		if err := b.checkWholeSeconds(); err != nil {
			return err
		}
	}
	switch {
	case cfg.Netns:
		return benchTransferNetns(ctx, out, cfg.Args, slices.Max(b.Conns), cfg.Iperf3Port, cfg.SplitCPUs, cfg.RPS)
	case cfg.Serve != "":
		return profiled(cfg.CPUProfile, "serve", func() error { return b.serve(ctx, out, cfg.Serve) })
	case cfg.Client != "":
		if cfg.Iperf3 != "" {
			b.Baseline = iperf3Against(cfg.Iperf3, cfg.Iperf3Port)
		}
		return profiled(cfg.CPUProfile, "client", func() error { return b.client(ctx, out, cfg.Client) })
	}
	return errors.New("bench transfer: give --netns, or --serve ADDR and --client ADDR")
}

// checkNetnsFlags refuses --split-cpus and --rps where they would do
// nothing: without --netns, and --rps without --split-cpus (both veths
// would steer to every CPU, not each to its own namespace's).
func checkNetnsFlags(netns, splitCPUs, rps bool) error {
	switch {
	case (splitCPUs || rps) && !netns:
		return errors.New("bench transfer: --split-cpus and --rps apply only with --netns")
	case rps && !splitCPUs:
		return errors.New("bench transfer: --rps needs --split-cpus (each namespace's packets steered to its own CPUs)")
	}
	return nil
}

// profiled runs side, with a CPU profile written to prefix.name.pprof
// unless prefix is empty.
func profiled(prefix, name string, side func() error) error {
	if prefix == "" {
		return side()
	}
	f, err := os.Create(prefix + "." + name + ".pprof")
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("cpu profile: %w", err)
	}
	err = side()
	pprof.StopCPUProfile()
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("cpu profile: %w", cerr)
	}
	return err
}

func (b *transferBench) parse(transports, ops, sizes, conns string) error {
	b.Transports, b.Ops = benchutil.SplitList(transports), benchutil.SplitList(ops)
	for _, t := range b.Transports {
		if t != "tcp" && t != "rdma" {
			return fmt.Errorf("bench transfer: unknown transport %q (tcp, rdma)", t)
		}
	}
	for _, o := range b.Ops {
		if o != "read" && o != "write" {
			return fmt.Errorf("bench transfer: unknown op %q (read, write)", o)
		}
	}
	for _, s := range benchutil.SplitList(sizes) {
		n, err := bytesize.Parse(s)
		if err != nil || n == 0 || uint64(n) > tcp.MaxPageBytes {
			return fmt.Errorf("bench transfer: size %q: want 1 B … 1 GiB", s)
		}
		b.Sizes = append(b.Sizes, uint64(n))
	}
	for _, s := range benchutil.SplitList(conns) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 64 {
			return fmt.Errorf("bench transfer: conns %q: want 1…64", s)
		}
		b.Conns = append(b.Conns, n)
	}
	if len(b.Sizes) == 0 || len(b.Conns) == 0 || len(b.Ops) == 0 || len(b.Transports) == 0 || b.Rounds < 1 || b.Seconds <= 0 {
		return errors.New("bench transfer: empty matrix")
	}
	return nil
}

// round is the length of one measured round, the baseline's rounds too.
// parseVerify sets the TCP verify modes of the matrix.
func (b *transferBench) parseVerify(modes string) error {
	b.Verify = nil
	for _, m := range benchutil.SplitList(modes) {
		if m == "default" { // the mode a client here chooses itself
			m = tcp.NewClient(nil).Verify.String()
		}
		if _, err := tcp.ParseVerify(m); err != nil {
			return fmt.Errorf("bench transfer: %w", err)
		}
		if !slices.Contains(b.Verify, m) {
			b.Verify = append(b.Verify, m)
		}
	}
	if len(b.Verify) == 0 {
		return errors.New("bench transfer: empty --verify")
	}
	return nil
}

// verifyModes are the verify modes of transport t's cells (TCP's; one,
// unnamed, for RDMA, whose bench checks every slot itself).
func (b *transferBench) verifyModes(t string) []string {
	if t != "tcp" {
		return []string{""}
	}
	return b.Verify
}

// cells lists the matrix's cells in the order they run.
func (b *transferBench) cells() []cell {
	var out []cell
	for _, n := range b.Conns {
		for _, t := range b.Transports {
			for _, op := range b.Ops {
				for _, size := range b.Sizes {
					for _, v := range b.verifyModes(t) {
						out = append(out, cell{transport: t, op: op, size: size, conns: n, verify: v})
					}
				}
			}
		}
	}
	return out
}

func (b *transferBench) round() time.Duration { return time.Duration(b.Seconds * float64(time.Second)) }

// checkWholeSeconds refuses a round length iperf3 cannot run (-t takes
// whole seconds): its rounds last as long as the cell's own.
func (b *transferBench) checkWholeSeconds() error {
	if b.Seconds != float64(int(b.Seconds)) {
		return fmt.Errorf("bench transfer: --seconds %g: want whole seconds beside iperf3 (-t takes whole seconds)", b.Seconds)
	}
	return nil
}

// pagesPer is how many pages of size the serve side holds (the client
// computes their checksums and holds one request's worth a connection).
func (b *transferBench) pagesPer(size uint64) int {
	return min(4096, max(4, int(b.PoolBytes/size)))
}

// batchOf is how many pages one request moves.
func (b *transferBench) batchOf(size uint64) int {
	return min(b.pagesPer(size), max(1, int(b.BatchBytes/size)))
}

// sendBuffer is the send buffer the serve side's connections ask for, the
// fetch's and the streams' alike (0: autotuned).
func (b *transferBench) sendBuffer() int {
	if b.SendBuffer >= 0 {
		return b.SendBuffer
	}
	return tcp.NewServer(nil, nil).SendBuffer
}

// experiments says how the serve side writes (read-ahead, splice, send
// buffers), for the header.
func (b *transferBench) experiments() string {
	n, whose := b.PrefetchBytes, ""
	if n < 0 {
		n, whose = tcp.NewServer(nil, nil).PrefetchBytes, " (its default with GOMAXPROCS as here)"
	}
	buf := b.sendBuffer()
	sndbuf := ", send buffers autotuned"
	if buf > 0 {
		sndbuf = fmt.Sprintf(", send buffers of %s asked for", bytesize.Size(buf))
	}
	switch {
	case b.Splice:
		return ", serve side splicing page bytes into the socket" + sndbuf
	case n == 0:
		return ", serve side writing answers in one go" + whose + sndbuf
	}
	return fmt.Sprintf(", serve side reading %s ahead of its writes%s%s", bytesize.Size(n), whose, sndbuf)
}

// transferKey names page i of size; both sides derive it.
func transferKey(size uint64, i int) pagekey.Key {
	var k pagekey.Key
	binary.LittleEndian.PutUint64(k[:], size)
	binary.LittleEndian.PutUint32(k[8:], uint32(i))
	copy(k[12:], "xfer")
	return k
}

// fillPage writes page i of size's deterministic contents into dst.
func fillPage(dst []byte, size uint64, i int) {
	r := rand.New(rand.NewPCG(size, uint64(i)))
	for j := 0; j+8 <= len(dst); j += 8 {
		binary.LittleEndian.PutUint64(dst[j:], r.Uint64())
	}
	for j := len(dst) &^ 7; j < len(dst); j++ {
		dst[j] = byte(r.Uint32())
	}
}

// transferPages is what one side holds for the matrix: the pages of every
// size, and each page's checksum, computed locally from its contents.
type transferPages struct {
	data map[pagekey.Key][]byte
	sums map[pagekey.Key]uint32
}

func (b *transferBench) pages(keep bool) *transferPages {
	p := &transferPages{data: map[pagekey.Key][]byte{}, sums: map[pagekey.Key]uint32{}}
	for _, size := range b.Sizes {
		scratch := make([]byte, size)
		var held []byte
		if keep {
			held = poolMemory(uint64(b.pagesPer(size)) * size)
		}
		for i := range b.pagesPer(size) {
			buf := scratch
			if keep {
				buf = held[uint64(i)*size : uint64(i+1)*size : uint64(i+1)*size]
			}
			fillPage(buf, size, i)
			k := transferKey(size, i)
			p.sums[k] = page.Checksum(buf)
			if keep {
				p.data[k] = buf
			}
		}
	}
	return p
}

// Open serves held pages (tcp.Source).
func (p *transferPages) Open(_ context.Context, wants []tcp.Want) ([]tcp.Page, func()) {
	out := make([]tcp.Page, len(wants))
	for i, w := range wants {
		if d, ok := p.data[w.Key]; ok && uint64(len(d)) == w.Size {
			out[i] = tcp.Page{Header: page.Header{Key: w.Key, Layout: benchLayout, Length: w.Size, Checksum: p.sums[w.Key], Generation: 1}, Data: d}
		}
	}
	return out, func() {}
}

func (b *transferBench) serve(ctx context.Context, out io.Writer, addr string) error {
	p := b.pages(true)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := tcp.NewServer(p, nil)
	srv.Splice = b.Splice
	srv.SendBuffer = b.sendBuffer()
	if b.PrefetchBytes >= 0 {
		srv.PrefetchBytes = b.PrefetchBytes
	}
	go func() { <-ctx.Done(); srv.Close() }()
	if b.Streams {
		stop, err := b.listenStreams(ctx, out, p, lis.Addr().String())
		if err != nil {
			srv.Close()
			return err
		}
		defer stop()
	}
	fmt.Fprintf(out, "serving %d pages on %s\n", len(p.data), lis.Addr())
	if err := srv.Serve(lis); !errors.Is(err, tcp.ErrServerClosed) {
		return err
	}
	return nil
}

// cell is one row of the matrix.
type cell struct {
	transport, op string
	size          uint64
	conns         int
	verify        string    // TCP: a tcp.Verify's name; "" for RDMA
	gbps          float64   // GB/s, verified bytes (median of the rounds)
	rounds        []float64 // TCP: GB/s of each measured round, in order
	pages         int64     // pages moved and verified
	skip          string
	variants      []iperfVariant          // the iperf3 baseline's variants, if any
	baseRates     [][]float64             // Gbit/s per variant and round
	baseCPU       []iperfCPU              // cores iperf3 reported per variant
	cpuClient     cpuUse                  // TCP: this process's CPU in the measured rounds
	cpuServer     cpuUse                  // TCP: the --serve process's, if its pid is known
	cpusFetch     cpuSpan                 // TCP: every CPU's times in the measured rounds (cpus.go)
	cpusBase      []cpuSpan               // the same in each iperf3 variant's rounds
	streams       [streamKinds]streamRuns // --streams: the plain streams' rounds
}

// verifyLabel is the cell's verify column.
func (c cell) verifyLabel() string {
	if c.verify == "" {
		return "-"
	}
	return c.verify
}

func (b *transferBench) client(ctx context.Context, out io.Writer, addr string) error {
	sums := b.pages(false).sums
	if b.Streams && b.StreamAddr == "" {
		a, err := streamAddrOf(addr)
		if err != nil {
			return err
		}
		b.StreamAddr = a
	}
	fmt.Fprintf(out, "bench transfer: sizes %v, conns %v, %d rounds of %gs per cell (median), %s per request, %s of pages per size served, GOMAXPROCS %d%s\n",
		fmtSizes(b.Sizes), b.Conns, b.Rounds, b.Seconds, bytesize.Size(b.BatchBytes), bytesize.Size(b.PoolBytes), runtime.GOMAXPROCS(0), b.experiments())
	printMemCopy(out, min(8, max(4, slices.Max(b.Conns))))
	if b.Streams {
		fmt.Fprintln(out, "stream: a bare TCP stream per round after the fetch's, of the cell's pages from the same memory into the same destinations (no header, no check); vs stream is the bar: the fetch at 90% of it or more")
	}
	if b.Baseline != nil {
		fmt.Fprintln(out, "iperf3 (-R, same link) per cell, its rounds interleaved with the cell's; baseline = the variant with the best median")
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "transport\top\tsize\tconns\tverify\tGB/s\tGbit/s\tstream Gbit/s\tvs stream\tiperf3 Gbit/s\tvs iperf3\tpages verified\t")
	var rdmaWhy string
	if contains(b.Transports, "rdma") {
		rdmaWhy = b.rdmaSkipReason()
	}
	cells := b.cells()
	for i := range cells {
		c := &cells[i]
		if err := b.measure(ctx, c, addr, sums, rdmaWhy); err != nil {
			tw.Flush()
			return fmt.Errorf("%s %s %s × %d: %w", c.transport, c.op, bytesize.Size(c.size), c.conns, err)
		}
		printCell(tw, *c)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printBaselines(out, cells)
	printStreams(out, cells)
	printCPU(out, cells)
	if contains(b.Transports, "tcp") && contains(b.Ops, "write") {
		fmt.Fprintln(out, "note: tcp WRITE skipped: transfer/tcp only fetches (READ); the batched Transport interface adds WRITE")
	}
	if rdmaWhy != "" {
		fmt.Fprintf(out, "note: rdma skipped: %s\n", rdmaWhy)
	}
	return nil
}

func printCell(w io.Writer, c cell) {
	if c.skip != "" {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\tskipped\t\t\t\t\t\t%s\t\n", c.transport, strings.ToUpper(c.op), bytesize.Size(c.size), c.conns, c.verifyLabel(), c.skip)
		return
	}
	var bar float64
	if r := c.streams[streamPool].rates; len(r) > 0 {
		bar = benchutil.Median(r)
	}
	stream, streamRatio := ratioTo(c.gbps*8, bar)
	_, base := bestBaseline(c.baseRates)
	iperf, iperfRatio := ratioTo(c.gbps*8, base)
	fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%.2f\t%.1f\t%s\t%s\t%s\t%s\t%d\t\n", c.transport, strings.ToUpper(c.op), bytesize.Size(c.size), c.conns, c.verifyLabel(),
		c.gbps, c.gbps*8, stream, streamRatio, iperf, iperfRatio, c.pages)
}

// ratioTo formats a baseline's rate and gbps's share of it (both Gbit/s);
// empty without a baseline.
func ratioTo(gbps, base float64) (string, string) {
	if base <= 0 {
		return "", ""
	}
	return fmt.Sprintf("%.1f", base), fmt.Sprintf("%.0f%%", 100*gbps/base)
}

// printBaselines lists, per cell with a baseline, every iperf3 variant's
// rounds and median, the baseline marked.
func printBaselines(out io.Writer, cells []cell) {
	for _, c := range cells {
		best, _ := bestBaseline(c.baseRates)
		for i, v := range c.variants {
			mark := ""
			if i == best {
				mark = "  <- baseline"
			}
			fmt.Fprintf(out, "iperf3 %s × %d (%s cell): %s: rounds %s Gbit/s, median %.1f%s\n",
				bytesize.Size(c.size), c.conns, c.verifyLabel(), v, fmtRates(c.baseRates[i]), benchutil.Median(c.baseRates[i]), mark)
		}
	}
}

func fmtRates(r []float64) string {
	s := make([]string, len(r))
	for i, x := range r {
		s[i] = fmt.Sprintf("%.1f", x)
	}
	return strings.Join(s, " ")
}

func (b *transferBench) measure(ctx context.Context, c *cell, addr string, sums map[pagekey.Key]uint32, rdmaWhy string) error {
	switch {
	case c.transport == "rdma" && rdmaWhy != "":
		c.skip = "no device"
		return nil
	case c.transport == "rdma":
		return b.measureRDMA(ctx, c)
	case c.op == "write":
		c.skip = "no WRITE op in transfer/tcp"
		return nil
	}
	cl := tcp.NewClient(nil)
	cl.Verify, _ = tcp.ParseVerify(c.verify) // parseVerify checked the name
	defer cl.Close()
	if b.Baseline != nil {
		c.variants = iperfVariants(c.size, c.conns)
		c.baseRates = make([][]float64, len(c.variants))
		c.baseCPU = make([]iperfCPU, len(c.variants))
		c.cpusBase = make([]cpuSpan, len(c.variants))
	}
	dst, unmap := b.destinations(c)
	defer unmap()
	var rates []float64
	for _, s := range planCell(b.Rounds, len(c.variants)) {
		if s.variant >= 0 {
			at := spanStart()
			r, err := b.Baseline(ctx, c.variants[s.variant], b.round())
			if err != nil {
				return err
			}
			c.cpusBase[s.variant].end(at)
			c.baseRates[s.variant] = append(c.baseRates[s.variant], r.gbps)
			c.baseCPU[s.variant].add(r)
			continue
		}
		m, at := startCPUMeter(b.ServePID), spanStart()
		rate, pages, err := b.tcpRound(ctx, cl, addr, c, sums, dst)
		if err != nil {
			return err
		}
		if s.round > 0 { // round 0 warms up (connections, destination memory)
			m.stop(c, float64(pages)*float64(c.size))
			c.cpusFetch.end(at)
			rates = append(rates, rate)
			c.pages += pages
		}
		if b.Streams { // after the fetch's round, warm-up included
			if err := b.measureStreams(ctx, c, dst, s.round > 0); err != nil {
				return err
			}
		}
	}
	c.gbps, c.rounds = benchutil.Median(rates), rates
	return nil
}

// destinations are each connection's buffers for one request's pages, in
// memory like the peer's pool (poolMemory), made once per cell and reused
// by every round.
func (b *transferBench) destinations(c *cell) ([][][]byte, func()) {
	per := b.batchOf(c.size)
	dst := make([][][]byte, c.conns)
	var maps [][]byte
	for s := range dst {
		mem := poolMemory(uint64(per) * c.size)
		maps = append(maps, mem)
		dst[s] = make([][]byte, per)
		for j := range dst[s] {
			dst[s][j] = mem[uint64(j)*c.size : uint64(j+1)*c.size : uint64(j+1)*c.size]
		}
	}
	return dst, func() {
		for _, m := range maps {
			unmapPool(m)
		}
	}
}

// poolMemory returns n bytes of memory like the peer's DRAM pool
// (tiers/dram): anonymous, transparent huge pages asked for, every page
// faulted in before use; Go heap memory if the mapping fails. (Go's heap
// is in 4 KiB pages here, and the peer never serves from it: from and into
// it the fetch moved up to 13% less, back to back; docs/benchmarks.md.)
func poolMemory(n uint64) []byte {
	mem, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return make([]byte, n)
	}
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // best effort, before the first touch
	if unix.Madvise(mem, unix.MADV_POPULATE_WRITE) != nil {
		clear(mem)
	}
	return mem
}

// unmapPool releases memory from poolMemory (Go heap memory is left to
// the collector).
func unmapPool(mem []byte) { _ = unix.Munmap(mem) }

// tcpRound fetches pages of c.size on c.conns connections for one round
// and returns the verified rate in GB/s. A page counts only if the client
// checked its bytes against the header's checksum and that checksum is the
// one this side computed from the page's contents.
func (b *transferBench) tcpRound(ctx context.Context, cl *tcp.Client, addr string, c *cell, sums map[pagekey.Key]uint32, dst [][][]byte) (float64, int64, error) {
	d := b.round()
	n, per := b.pagesPer(c.size), b.batchOf(c.size)
	var moved, pages atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, c.conns)
	start := time.Now()
	for s := range c.conns {
		wg.Go(func() {
			for i := s * per; time.Since(start) < d; i += c.conns * per {
				wants := make([]tcp.Want, per)
				for j := range wants {
					wants[j] = tcp.Want{Key: transferKey(c.size, (i+j)%n), Layout: benchLayout, Size: c.size}
				}
				fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				res := cl.Fetch(fctx, addr, wants, dst[s])
				cancel()
				for j, r := range res {
					if err := checkFetched(r, wants[j], sums); err != nil {
						errc <- err
						return
					}
				}
				moved.Add(int64(per) * int64(c.size))
				pages.Add(int64(per))
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return 0, 0, err
	default:
	}
	return benchutil.Gbps(uint64(moved.Load()), time.Since(start)), pages.Load(), nil
}

func checkFetched(r tcp.Result, w tcp.Want, sums map[pagekey.Key]uint32) error {
	switch {
	case r.Err != nil:
		return r.Err
	case r.Header.Key != w.Key || r.Header.Length != w.Size:
		return fmt.Errorf("page %x: header names %x, %d bytes", w.Key[:8], r.Header.Key[:8], r.Header.Length)
	case r.Header.Checksum != sums[w.Key]:
		return fmt.Errorf("page %x: checksum %08x, computed here %08x", w.Key[:8], r.Header.Checksum, sums[w.Key])
	}
	return nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func fmtSizes(s []uint64) []string {
	out := make([]string, len(s))
	for i, n := range s {
		out[i] = bytesize.Size(n).String()
	}
	return out
}
