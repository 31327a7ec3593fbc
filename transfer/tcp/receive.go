package tcp

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/orbitkv/orbitkv/internal/page"
)

// Receiving an answer: each page's status and header, then its bytes read
// straight into the destination in reads of at most recvChunk, each read's
// bytes checksummed by the reading goroutine right after the read, while
// they are in its core's cache, the CRC continued piece by piece. (A
// verifier goroutine summing each read while the next one ran was slower
// on two cores in every cell measured back to back, 6–10% with two
// connections: its bytes came from the other core's cache and each piece
// cost a handoff. docs/journal/2026-11-30-tcp-data-plane.md, "An interleaved
// baseline, and the check on the reading goroutine".) Where cores are
// free it does not always hold: Client.Verify (VerifyBehind, and
// VerifyAuto, NewClient's choice from 4 cores, when another Fetch is under
// way) sums on a goroutine of the Fetch's own (summer, below), and on the
// GPU machine's 16 cores two connections moved more that way
// (docs/journal/2026-11-30-tcp-data-plane.md, "Reading ahead of the writer", "A faster CRC-32C").

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
// checksummed right after it, still in the L2 of the core that read them
// (512 KiB to 1 MiB on the development machines); 64 KiB and 1 MiB
// measured no different.
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

// readVerified reads a page's bytes into dst, summing them as they land,
// and checks the sum against h.
func readVerified(r io.Reader, dst []byte, h page.Header) (verr, err error) {
	var crc uint32
	if err := readPage(r, dst, func(b []byte) { crc = page.UpdateChecksum(crc, b) }); err != nil {
		return nil, err
	}
	return h.VerifySum(crc), nil
}

// summerDepth is how many reads a summer may lag behind (at recvChunk
// each, 4 MiB): a reader that gets further ahead waits for it.
const summerDepth = 16

// summer checksums a Fetch's pages on a goroutine of its own, in the order
// their bytes were read (VerifyBehind): the reading goroutine hands
// it each read's bytes (add) and each page's end (end), and reads on.
type summer struct {
	jobs chan sumJob
	done chan struct{}
}

// sumJob is the next bytes of the page being summed, or (verdict set) its
// end: compare with h, set *verdict, count its bytes in received if good.
type sumJob struct {
	data    []byte
	h       page.Header
	verdict *error
}

func startSummer(received *atomic.Uint64) *summer {
	s := &summer{jobs: make(chan sumJob, summerDepth), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		var crc uint32
		for j := range s.jobs {
			if j.verdict == nil {
				crc = page.UpdateChecksum(crc, j.data)
				continue
			}
			if *j.verdict = j.h.VerifySum(crc); *j.verdict == nil {
				received.Add(j.h.Length)
			}
			crc = 0
		}
	}()
	return s
}

func (s *summer) add(b []byte) { s.jobs <- sumJob{data: b} }

func (s *summer) end(h page.Header, verdict *error) { s.jobs <- sumJob{h: h, verdict: verdict} }

// wait returns once every page handed over is summed; the summer ends.
func (s *summer) wait() {
	close(s.jobs)
	<-s.done
}
