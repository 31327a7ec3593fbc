package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/orbitkv/orbitkv/transfer"
	"time"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Want names one page a client asks for: its key, the layout it must have
// and its data size in bytes.
type Want struct {
	Key    pagekey.Key
	Layout pagekey.Fingerprint
	Size   uint64
}

const (
	magic       = "OKVF"
	version     = 1
	opFetch     = 1
	reqHeadSize = 16
	wantSize    = pagekey.Size + pagekey.Size + 8

	statusOK       = 0
	statusNotFound = 1
)

// MaxPages is the most pages one request may name.
const MaxPages = 1 << 14

// MaxPageBytes is the largest page the protocol carries.
const MaxPageBytes = 1 << 30

// MaxDeadline bounds the deadline a request may carry.
const MaxDeadline = 5 * time.Minute

// ErrProtocol reports bytes that do not follow the wire format.
var ErrProtocol = errors.New("tcp data plane: protocol error")

// ErrNotFound reports a page the server does not hold (any more), or holds
// with another layout or size.
var ErrNotFound = transfer.ErrRemoteNotFound

// request is a decoded fetch request.
type request struct {
	deadline time.Duration
	wants    []Want
}

// appendRequest encodes a fetch of wants with the given deadline.
func appendRequest(dst []byte, deadline time.Duration, wants []Want) []byte {
	var head [reqHeadSize]byte
	copy(head[:], magic)
	head[4], head[5] = version, opFetch
	binary.LittleEndian.PutUint32(head[8:], uint32(min(max(deadline, time.Millisecond), MaxDeadline)/time.Millisecond))
	binary.LittleEndian.PutUint32(head[12:], uint32(len(wants)))
	dst = append(dst, head[:]...)
	for _, w := range wants {
		dst = append(dst, w.Key[:]...)
		dst = append(dst, w.Layout[:]...)
		dst = binary.LittleEndian.AppendUint64(dst, w.Size)
	}
	return dst
}

// parseHead checks a request head and returns its deadline and page count.
func parseHead(head []byte) (time.Duration, int, error) {
	if string(head[:4]) != magic {
		return 0, 0, fmt.Errorf("%w: bad magic %q", ErrProtocol, head[:4])
	}
	if head[4] != version || head[5] != opFetch {
		return 0, 0, fmt.Errorf("%w: version %d op %d", ErrProtocol, head[4], head[5])
	}
	ms := binary.LittleEndian.Uint32(head[8:])
	n := binary.LittleEndian.Uint32(head[12:])
	if n == 0 || n > MaxPages {
		return 0, 0, fmt.Errorf("%w: %d pages (1..%d)", ErrProtocol, n, MaxPages)
	}
	d := min(time.Duration(ms)*time.Millisecond, MaxDeadline)
	if d <= 0 {
		return 0, 0, fmt.Errorf("%w: no deadline", ErrProtocol)
	}
	return d, int(n), nil
}

// parseWants decodes n wants from b (n*wantSize bytes).
func parseWants(b []byte, n int) ([]Want, error) {
	wants := make([]Want, n)
	for i := range wants {
		w := b[i*wantSize:]
		copy(wants[i].Key[:], w[:16])
		copy(wants[i].Layout[:], w[16:32])
		wants[i].Size = binary.LittleEndian.Uint64(w[32:])
		if wants[i].Size == 0 || wants[i].Size > MaxPageBytes {
			return nil, fmt.Errorf("%w: page %s size %d", ErrProtocol, wants[i].Key, wants[i].Size)
		}
	}
	return wants, nil
}
