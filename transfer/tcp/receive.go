package tcp

import (
	"fmt"
	"io"

	"github.com/orbitkv/orbitkv/internal/page"
)

// Receiving an answer: each page's status and header, then its bytes read
// straight into the destination in reads of at most recvChunk, each read's
// bytes handed to a verifier goroutine that checksums them while the next
// read runs: the bytes are still in cache, and the last page of an answer
// leaves at most one read to sum, not a whole page. (Summing on the
// reading goroutine itself, right after each read, was slower on two
// cores: the sums then wait for the reads. docs/benchmarks.md.)

// readHead reads a page's status and, if it is sent, its header, which
// must name w; ok false means the server does not hold it.
func readHead(r io.Reader, w Want) (h page.Header, ok bool, err error) {
	var hb [1 + page.WireSize]byte
	if _, err := io.ReadFull(r, hb[:1]); err != nil {
		return h, false, fmt.Errorf("read answer: %w", err)
	}
	switch hb[0] {
	case statusOK:
	case statusNotFound:
		return h, false, nil
	default:
		return h, false, fmt.Errorf("%w: status %d", ErrProtocol, hb[0])
	}
	if _, err := io.ReadFull(r, hb[1:]); err != nil {
		return h, false, fmt.Errorf("read page header: %w", err)
	}
	if h, err = page.Decode(hb[1:]); err != nil {
		return h, false, err
	}
	if h.Key != w.Key || h.Layout != w.Layout || h.Length != w.Size {
		return h, false, fmt.Errorf("%w: asked for page %s (%d bytes), got %s (%d bytes)", ErrProtocol, w.Key, w.Size, h.Key, h.Length)
	}
	return h, true, nil
}

// recvChunk is the most one read takes into a page: its bytes are
// checksummed while the next read runs and are still in cache (the L2 of
// the core that read them, 512 KiB on the development machine, or the
// shared L3), and the last read of an answer leaves at most this much to
// sum once the bytes are in.
const recvChunk = 256 << 10

// readPage fills dst from r in reads of at most recvChunk and hands each
// read's bytes, in order, to got (if not nil) right after the read.
func readPage(r io.Reader, dst []byte, got func([]byte)) error {
	for off := 0; off < len(dst); {
		n, err := r.Read(dst[off:min(off+recvChunk, len(dst))])
		if got != nil && n > 0 {
			got(dst[off : off+n])
		}
		if off += n; off == len(dst) {
			return nil
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// verifier checksums an answer's pages on a goroutine of its own, piece by
// piece as they are read, and checks each page against its header once
// its last piece is summed: errs[i] for a page that fails, the client's
// received bytes for one that passes.
type verifier struct {
	pieces chan piece
	done   chan struct{}
}

// piece is a read's bytes of the page being read, or (end) the page's
// header after its last piece.
type piece struct {
	b   []byte
	end bool
	i   int
	h   page.Header
}

func (c *Client) startVerifier(errs []error) *verifier {
	v := &verifier{pieces: make(chan piece, 64), done: make(chan struct{})}
	go func() {
		defer close(v.done)
		var crc uint32
		for p := range v.pieces {
			if !p.end {
				crc = page.UpdateChecksum(crc, p.b)
				continue
			}
			if errs[p.i] = p.h.VerifySum(crc); errs[p.i] == nil {
				c.received.Add(p.h.Length)
			}
			crc = 0
		}
	}()
	return v
}

// sum hands a read's bytes of the page being read to the verifier.
func (v *verifier) sum(b []byte) { v.pieces <- piece{b: b} }

// end says page i, whose header is h, has been read in full.
func (v *verifier) end(i int, h page.Header) { v.pieces <- piece{end: true, i: i, h: h} }

// wait ends the answer and returns once every piece handed over is summed.
func (v *verifier) wait() {
	close(v.pieces)
	<-v.done
}
