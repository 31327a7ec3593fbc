package tcp

import (
	"net"
	"runtime"
	"sync/atomic"
)

// Prefetching an answer's pages (Server.PrefetchBytes): the writer's copy
// into the socket reads each page from memory that is mostly out of the
// caches, at what one core's loads from DRAM allow (a one-thread copy of
// large buffers moved about 6 GB/s on the GPU machine's cores). A goroutine
// of the request's own reads the answer's bytes a little ahead of the
// writer, so that the copy finds them nearer. On the GPU machine's 16
// cores this lifted one connection from 71–76% of iperf3 to 82–95%, and
// two from 45–63% to 62–90%; on two cores, where the reads take the
// writer's own core, it lost (84% against 91%): docs/benchmarks.md,
// "Reading ahead of the writer". So it is on by default only where the
// process has cores to spare (spareCores).

// DefaultPrefetchBytes is how far ahead of the writer the prefetcher reads
// by default: eight 256-KiB pieces, the distance measured.
const DefaultPrefetchBytes = 2 << 20

// pieceBytes is the most page bytes one write takes when prefetching, so
// that the prefetcher knows where the writer is within large pages too.
const pieceBytes = 256 << 10

// spareCoresAt is the GOMAXPROCS from which the defaults spend a core of
// their own per connection (prefetching here, checksums behind the reads
// in Client): below it the extra goroutine shares the core it would relieve.
const spareCoresAt = 4

func spareCores() bool { return runtime.GOMAXPROCS(0) >= spareCoresAt }

// prefetchSink keeps the prefetcher's loads from being optimized away.
var prefetchSink atomic.Uint32

// touch loads one byte of every cache line of b.
func touch(b []byte) {
	var s byte
	for i := 0; i < len(b); i += 64 {
		s += b[i]
	}
	prefetchSink.Store(uint32(s))
}

// piece is one write of a prefetched answer: statuses and headers, then at
// most pieceBytes of one page's bytes (data, nil for the trailing statuses
// of missing pages).
type piece struct {
	bufs net.Buffers
	data []byte
}

// pieces cuts an answer (answer's bufs; bufs[i] for i in isData is page
// bytes) into writes that each end with at most pieceBytes of a page.
func pieces(bufs net.Buffers, isData map[int]bool) []piece {
	var out []piece
	var pending net.Buffers
	for i, b := range bufs {
		if !isData[i] {
			pending = append(pending, b)
			continue
		}
		for off := 0; off < len(b); off += pieceBytes {
			d := b[off:min(off+pieceBytes, len(b))]
			out = append(out, piece{bufs: append(pending, d), data: d})
			pending = nil
		}
	}
	if len(pending) > 0 {
		out = append(out, piece{bufs: pending})
	}
	return out
}

// writePrefetched writes bufs to c piece by piece (pieces), a goroutine
// reading each piece's page bytes while the writer is at most ahead bytes
// behind it. It returns the first write error; the prefetcher has ended by
// then.
func writePrefetched(c net.Conn, bufs net.Buffers, data []int, ahead int) error {
	isData := make(map[int]bool, len(data))
	for _, i := range data {
		isData[i] = true
	}
	ps := pieces(bufs, isData)
	depth := max(1, ahead/pieceBytes)
	next := make(chan []byte, depth)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range next {
			touch(d)
		}
	}()
	defer func() { close(next); <-done }()
	handed := 0
	hand := func(upTo int) {
		for ; handed < min(upTo, len(ps)); handed++ {
			if ps[handed].data != nil {
				next <- ps[handed].data
			}
		}
	}
	for k := range ps {
		hand(k + 1 + depth)
		if _, err := ps[k].bufs.WriteTo(c); err != nil {
			return err
		}
	}
	return nil
}
