package page

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Length: 12345, Checksum: 0xdeadbeef, Generation: 42}
	h.Key[0], h.Layout[15] = 1, 2
	buf := make([]byte, HeaderSize)
	h.Encode(buf)
	got, err := Decode(buf)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v; want %+v", got, err, h)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := make([]byte, HeaderSize)
	Header{Length: 1}.Encode(good)
	for name, mutate := range map[string]func([]byte){
		"zero block":      func(b []byte) { clear(b) },
		"flipped length":  func(b []byte) { b[44] ^= 1 },
		"flipped version": func(b []byte) { b[8] = 9 },
		"flipped crc":     func(b []byte) { b[64] ^= 0x80 },
	} {
		t.Run(name, func(t *testing.T) {
			b := bytes.Clone(good)
			mutate(b)
			if _, err := Decode(b); !errors.Is(err, ErrBadHeader) {
				t.Fatalf("want ErrBadHeader, got %v", err)
			}
		})
	}
	if _, err := Decode(good[:10]); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("short block: want ErrBadHeader, got %v", err)
	}
}

func TestVerify(t *testing.T) {
	data := []byte("kv bytes of one page")
	h := Header{Length: uint64(len(data)), Checksum: Checksum(data)}
	if err := h.Verify(data); err != nil {
		t.Fatal(err)
	}
	data[3] ^= 0x10
	var ce *CorruptError
	if err := h.Verify(data); !errors.As(err, &ce) {
		t.Fatalf("want CorruptError, got %v", err)
	}
	if err := h.Verify(data[:5]); !errors.As(err, &ce) {
		t.Fatalf("short data: want CorruptError, got %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	good := make([]byte, HeaderSize)
	Header{Length: 7, Checksum: 3}.Encode(good)
	f.Add(good)
	f.Add([]byte("OKVPAGE\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Decode(b)
		if err != nil {
			return
		}
		out := make([]byte, HeaderSize)
		h.Encode(out)
		if h2, err := Decode(out); err != nil || h2 != h {
			t.Fatalf("re-encode: %+v %v", h2, err)
		}
	})
}

// TestChecksumInPieces: a checksum continued over a page's pieces, in
// order, is the whole page's, whatever the cut; a changed byte in any piece
// fails VerifySum.
func TestChecksumInPieces(t *testing.T) {
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	h := Header{Length: uint64(len(data)), Checksum: Checksum(data)}
	sum := func(b []byte, piece int) uint32 {
		var crc uint32
		for off := 0; off < len(b); off += piece {
			crc = UpdateChecksum(crc, b[off:min(off+piece, len(b))])
		}
		return crc
	}
	for _, piece := range []int{1, 7, 4096, 9999, 10000, 20000} {
		if got := sum(data, piece); got != h.Checksum {
			t.Errorf("pieces of %d: %08x, whole page %08x", piece, got, h.Checksum)
		}
		for _, at := range []int{0, piece - 1, len(data) / 2, len(data) - 1} {
			if at < 0 || at >= len(data) {
				continue
			}
			bad := bytes.Clone(data)
			bad[at] ^= 0x01
			var ce *CorruptError
			if err := h.VerifySum(sum(bad, piece)); !errors.As(err, &ce) {
				t.Errorf("pieces of %d, byte %d changed: %v, want CorruptError", piece, at, err)
			}
		}
	}
}
