package page

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/orbitkv/orbitkv/internal/crc32c"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// HeaderSize is the size of an encoded header: one O_DIRECT block.
const HeaderSize = 4096

// Alignment is the alignment of page buffers and SSD offsets (O_DIRECT).
const Alignment = 4096

const (
	magic   = "OKVPAGE\x00"
	version = 1
	// encodedLen is the number of meaningful header bytes; the rest is zero.
	encodedLen = 8 + 2 + 2 + 16 + 16 + 8 + 4 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of data (internal/crc32c: folded on vector
// registers where the CPU has them).
func Checksum(data []byte) uint32 { return crc32c.Checksum(data) }

// UpdateChecksum continues crc, the CRC-32C of the bytes before data, over
// data: summing a page piece by piece, in order, from crc 0 gives its
// Checksum.
func UpdateChecksum(crc uint32, data []byte) uint32 { return crc32c.Update(crc, data) }

// Header describes one page blob.
type Header struct {
	Key        pagekey.Key
	Layout     pagekey.Fingerprint
	Length     uint64 // bytes of page data (without padding)
	Checksum   uint32 // CRC-32C of the Length data bytes
	Generation uint64 // peer-wide save counter; newer wins on recovery
}

// ErrBadHeader reports a block that is not a valid page header.
var ErrBadHeader = errors.New("invalid page header")

// CorruptError reports a page whose bytes do not match its checksum. It is
// the only way corruption is reported; match it with errors.As.
type CorruptError struct {
	Key    pagekey.Key
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("page %s corrupt: %s", e.Key, e.Reason)
}

// WireSize is the size of a header sent over the network: its meaningful
// bytes, without the padding to an O_DIRECT block.
const WireSize = encodedLen

// Encode writes h into dst, which must hold HeaderSize bytes.
func (h Header) Encode(dst []byte) {
	_ = dst[HeaderSize-1]
	clear(dst[:HeaderSize])
	h.put(dst)
}

// EncodeWire writes h into dst[:WireSize], the form the network carries;
// Decode reads it back.
func (h Header) EncodeWire(dst []byte) {
	_ = dst[WireSize-1]
	clear(dst[:WireSize])
	h.put(dst)
}

func (h Header) put(dst []byte) {
	copy(dst, magic)
	binary.LittleEndian.PutUint16(dst[8:], version)
	copy(dst[12:], h.Key[:])
	copy(dst[28:], h.Layout[:])
	binary.LittleEndian.PutUint64(dst[44:], h.Length)
	binary.LittleEndian.PutUint32(dst[52:], h.Checksum)
	binary.LittleEndian.PutUint64(dst[56:], h.Generation)
	binary.LittleEndian.PutUint32(dst[64:], crc32.Checksum(dst[:64], castagnoli))
}

// Decode parses a header block.
func Decode(src []byte) (Header, error) {
	var h Header
	if len(src) < encodedLen {
		return h, fmt.Errorf("%w: %d bytes", ErrBadHeader, len(src))
	}
	if string(src[:8]) != magic {
		return h, fmt.Errorf("%w: bad magic", ErrBadHeader)
	}
	if v := binary.LittleEndian.Uint16(src[8:]); v != version {
		return h, fmt.Errorf("%w: version %d", ErrBadHeader, v)
	}
	if got, want := crc32.Checksum(src[:64], castagnoli), binary.LittleEndian.Uint32(src[64:]); got != want {
		return h, fmt.Errorf("%w: header checksum %08x, want %08x", ErrBadHeader, got, want)
	}
	copy(h.Key[:], src[12:28])
	copy(h.Layout[:], src[28:44])
	h.Length = binary.LittleEndian.Uint64(src[44:])
	h.Checksum = binary.LittleEndian.Uint32(src[52:])
	h.Generation = binary.LittleEndian.Uint64(src[56:])
	return h, nil
}

// Verify checks data against the header's length and checksum.
func (h Header) Verify(data []byte) error {
	if uint64(len(data)) != h.Length {
		return &CorruptError{Key: h.Key, Reason: fmt.Sprintf("length %d, header says %d", len(data), h.Length)}
	}
	return h.VerifySum(Checksum(data))
}

// VerifySum checks sum, the CRC-32C of the page's Length bytes computed as
// they arrived (UpdateChecksum), against the header's checksum.
func (h Header) VerifySum(sum uint32) error {
	if sum != h.Checksum {
		return &CorruptError{Key: h.Key, Reason: fmt.Sprintf("checksum %08x, want %08x", sum, h.Checksum)}
	}
	return nil
}

// AlignUp rounds n up to a multiple of Alignment.
func AlignUp(n uint64) uint64 { return (n + Alignment - 1) &^ (Alignment - 1) }
