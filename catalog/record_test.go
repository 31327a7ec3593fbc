package catalog

import (
	"bytes"
	"errors"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func TestRecordRoundTrip(t *testing.T) {
	e := ssdEntry(12345)
	e.LastAccess = -1
	e.Hits = ^uint64(0)
	v := appendRecord(nil, e)
	if len(v) != recordLenV1 {
		t.Fatalf("record is %d bytes, want %d", len(v), recordLenV1)
	}
	got, err := decodeRecord(e.Key, v)
	if err != nil || got != e {
		t.Fatalf("decode = %+v, %v; want %+v", got, err, e)
	}
	if _, err := decodeRecord(key(1), v); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("decode under another key = %v, want ErrCorruptRecord", err)
	}
	k, err := parseRecordKey(appendRecordKey(nil, e.Key))
	if err != nil || k != e.Key {
		t.Fatalf("parseRecordKey = %s, %v", k, err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for i := range 4 {
		e := ssdEntry(i)
		f.Add(e.Key[:], appendRecord(nil, e))
	}
	f.Add(make([]byte, 16), []byte{})
	f.Add(make([]byte, 16), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, kb, v []byte) {
		k, err := pagekey.FromBytes(kb)
		if err != nil {
			return
		}
		e, err := decodeRecord(k, v)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("decode error %v does not wrap ErrCorruptRecord", err)
			}
			return
		}
		if e.Key != k || !e.OnSSD || e.DRAMSlot != -1 {
			t.Fatalf("decoded %+v", e)
		}
		if again := appendRecord(nil, e); !bytes.Equal(again, v) {
			t.Fatalf("re-encode differs:\n got %x\nwant %x", again, v)
		}
	})
}
