package tcp

import (
	"sync/atomic"

	"github.com/orbitkv/orbitkv/internal/memtouch"
)

// Warming a Fetch's destination (Client.WarmBytes): the kernel's copy of
// each read into the destination writes memory that is mostly out of the
// caches, as the serve side's copy out of its pages reads it
// (prefetch.go). A goroutine of the Fetch's own loads one byte of every
// destination line a little ahead of the reads, so that the reading core's
// stores find the lines nearer than DRAM. Its loads are hints
// (internal/memtouch): it never writes, and a line it reaches after the
// reader has filled it is only a wasted load.

// warmer touches a Fetch's destination pages, handed over in pieces of at
// most pieceBytes, at most ahead bytes in front of the reader.
type warmer struct {
	pieces [][]byte
	ahead  int
	next   chan []byte
	done   chan struct{}
	handed int // pieces handed to the goroutine
	bytes  int // page bytes in the pieces handed
	read   int // page bytes the reader has read (or skipped)
}

// startWarmer cuts dst into pieces and starts the goroutine with the
// first ahead bytes (at least one piece) handed over.
func startWarmer(dst [][]byte, ahead int) *warmer {
	w := &warmer{ahead: max(ahead, pieceBytes), done: make(chan struct{})}
	for _, d := range dst {
		for len(d) > 0 {
			n := min(len(d), pieceBytes)
			w.pieces = append(w.pieces, d[:n])
			d = d[n:]
		}
	}
	w.next = make(chan []byte, w.ahead/pieceBytes+1)
	var sink atomic.Uint32
	go func() {
		defer close(w.done)
		var s byte
		for p := range w.next {
			s += memtouch.Lines(p)
		}
		sink.Store(uint32(s))
	}()
	w.hand()
	return w
}

// advance counts n more bytes read (or skipped: a page not sent) and hands
// over the pieces that are now within ahead of the reader; on a nil
// warmer it does nothing.
func (w *warmer) advance(n int) {
	if w == nil {
		return
	}
	w.read += n
	w.hand()
}

func (w *warmer) hand() {
	for w.handed < len(w.pieces) && w.bytes < w.read+w.ahead {
		p := w.pieces[w.handed]
		select {
		case w.next <- p:
		default: // the goroutine is behind: the reader will be there first
		}
		w.handed++
		w.bytes += len(p)
	}
}

// stop returns once the goroutine has ended: the caller may then hand the
// destination on. On a nil warmer it does nothing.
func (w *warmer) stop() {
	if w == nil {
		return
	}
	close(w.next)
	<-w.done
}
