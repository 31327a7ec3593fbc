package tcp

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
)

// TestReadPageInPieces: readPage hands over the page's bytes in order, in
// pieces of at most recvChunk, whatever the reads return, and the checksum
// continued over the pieces is the whole page's.
func TestReadPageInPieces(t *testing.T) {
	readers := map[string]func(io.Reader) io.Reader{
		"whole reads": func(r io.Reader) io.Reader { return r },
		"half reads":  iotest.HalfReader,
		"data and EOF together": func(r io.Reader) io.Reader {
			return iotest.DataErrReader(r)
		},
	}
	for _, size := range []int{1, 4097, recvChunk - 1, recvChunk, recvChunk + 1, 3*recvChunk + 5} {
		data := pattern(size)
		for name, wrap := range readers {
			dst := make([]byte, size)
			var crc uint32
			var joined []byte
			err := readPage(wrap(bytes.NewReader(data)), dst, func(b []byte) {
				if len(b) > recvChunk {
					t.Errorf("%s, %d bytes: a piece of %d bytes", name, size, len(b))
				}
				crc = page.UpdateChecksum(crc, b)
				joined = append(joined, b...)
			})
			switch {
			case err != nil:
				t.Errorf("%s, %d bytes: %v", name, size, err)
			case !bytes.Equal(dst, data) || !bytes.Equal(joined, data):
				t.Errorf("%s, %d bytes: bytes differ", name, size)
			case crc != page.Checksum(data):
				t.Errorf("%s, %d bytes: pieces sum to %08x, page %08x", name, size, crc, page.Checksum(data))
			}
		}
	}
}

func TestReadPageShortStream(t *testing.T) {
	data := pattern(recvChunk + 10)
	err := readPage(bytes.NewReader(data[:recvChunk+3]), make([]byte, len(data)), nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a stream that ends inside the page: %v, want unexpected EOF", err)
	}
}

// TestChangedPieceIsCaught: a page served with one byte changed in its
// first, a middle or its last piece (the header keeping the true
// checksum) fails alone as corrupt; its neighbours in the answer arrive.
func TestChangedPieceIsCaught(t *testing.T) {
	size := 3*recvChunk + 100
	for name, at := range map[string]int{"first byte": 0, "middle piece": recvChunk + recvChunk/2, "last byte": size - 1} {
		t.Run(name, func(t *testing.T) {
			src := newMemSource()
			a, bad, c3 := src.add(1, size), src.add(2, size), src.add(3, 5000)
			src.flip[bad.Key] = at
			_, addr := serve(t, src, nil)
			c := NewClient(nil)
			defer c.Close()
			ask := []Want{a, bad, c3}
			dst := buffers(ask)
			errs := errsOf(c.Fetch(ctxFor(t, 10*time.Second), addr, ask, dst))
			var ce *page.CorruptError
			if !errors.As(errs[1], &ce) || ce.Key != bad.Key {
				t.Fatalf("changed page: %v, want a CorruptError for it", errs[1])
			}
			if errs[0] != nil || errs[2] != nil || !bytes.Equal(dst[0], src.pages[a.Key].Data) || !bytes.Equal(dst[2], src.pages[c3.Key].Data) {
				t.Fatalf("neighbours of the changed page: %v, %v", errs[0], errs[2])
			}
			if got := c.ReceivedBytes(); got != a.Size+c3.Size {
				t.Errorf("received %d verified bytes, want %d", got, a.Size+c3.Size)
			}
		})
	}
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>9)
	}
	return b
}
