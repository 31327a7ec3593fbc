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
// cores this lifted one connection from 69–76% of iperf3 to 82–95%, and
// two from 45–63% to 62–90%; on two cores, where the reads take the
// writer's own core, it lost (84% against 91% in one run):
// docs/journal/2026-11-30-tcp-data-plane.md, "Reading ahead of the writer".
// So it is on by default only where the process has cores to spare
// (spareCores).

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

// piece is one write of a prefetched answer: statuses, headers and page
// bytes, pieceBytes of page bytes in all (the last piece may hold fewer),
// and the page bytes in it (data), which the prefetcher reads.
type piece struct {
	bufs net.Buffers
	data [][]byte
}

// pieces cuts an answer (answer's bufs; bufs[i] for i in data, which
// ascends, is page bytes) into writes of pieceBytes of page bytes each:
// small pages share a piece, large ones are cut, so that a piece's count is
// a distance in bytes.
func pieces(bufs net.Buffers, data []int) []piece {
	var out []piece
	var cur piece
	n := 0
	for i, b := range bufs {
		if len(data) == 0 || data[0] != i {
			cur.bufs = append(cur.bufs, b)
			continue
		}
		data = data[1:]
		for len(b) > 0 {
			take := min(len(b), pieceBytes-n)
			cur.bufs = append(cur.bufs, b[:take])
			cur.data = append(cur.data, b[:take])
			b, n = b[take:], n+take
			if n == pieceBytes {
				out = append(out, cur)
				cur, n = piece{}, 0
			}
		}
	}
	if len(cur.bufs) > 0 {
		out = append(out, cur)
	}
	return out
}

// writePrefetched writes bufs to c piece by piece (pieces), a goroutine
// reading each piece's page bytes while the writer is at most ahead bytes
// (rounded down to whole pieces, at least one) behind it. It returns the
// first write error; the prefetcher has ended by then, so it never reads a
// page after the caller releases it.
func writePrefetched(c net.Conn, bufs net.Buffers, data []int, ahead int) error {
	ps := pieces(bufs, data)
	depth := max(1, ahead/pieceBytes)
	next := make(chan [][]byte, depth)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range next {
			for _, b := range d {
				touch(b)
			}
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
