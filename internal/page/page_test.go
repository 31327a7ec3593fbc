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
