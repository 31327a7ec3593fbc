package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func TestRecordRoundTrip(t *testing.T) {
	e := ssdEntry(12345)
	e.LastAccess = -1
	e.Hits = ^uint64(0)
	for _, demoted := range []bool{false, true} {
		e.Demoted = demoted
		v := appendRecord(nil, e)
		if len(v) != recordLenV2 {
			t.Fatalf("record is %d bytes, want %d", len(v), recordLenV2)
		}
		got, err := decodeRecord(e.Key, v)
		if err != nil || got != e {
			t.Fatalf("decode = %+v, %v; want %+v", got, err, e)
		}
	}
	v := appendRecord(nil, e)
	if _, err := decodeRecord(key(1), v); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("decode under another key = %v, want ErrCorruptRecord", err)
	}
	k, err := parseRecordKey(appendRecordKey(nil, e.Key))
	if err != nil || k != e.Key {
		t.Fatalf("parseRecordKey = %s, %v", k, err)
	}
}

// recordV1 is e's record in the version-1 layout (no flags byte).
func recordV1(e Entry) []byte {
	v := append([]byte{recordVersion1}, appendRecord(nil, e)[1:73]...)
	return binary.LittleEndian.AppendUint32(v, recordCRC(e.Key, v))
}

// TestVersion1RecordsStillDecode: records written before the demoted flag
// decode as they were, not demoted (never replaced by a readmission); a
// version-2 record with an unknown flag is refused.
func TestVersion1RecordsStillDecode(t *testing.T) {
	e := ssdEntry(7)
	e.Demoted = true
	v2 := appendRecord(nil, e)
	got, err := decodeRecord(e.Key, recordV1(e))
	e.Demoted = false
	if err != nil || got != e {
		t.Fatalf("version-1 decode = %+v, %v; want %+v", got, err, e)
	}
	bad := append([]byte(nil), v2[:74]...)
	bad[73] |= 0x80
	bad = binary.LittleEndian.AppendUint32(bad, recordCRC(e.Key, bad))
	if _, err := decodeRecord(e.Key, bad); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("unknown flag: %v, want ErrCorruptRecord", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for i := range 4 {
		e := ssdEntry(i)
		e.Demoted = i%2 == 1
		f.Add(e.Key[:], appendRecord(nil, e))
		f.Add(e.Key[:], recordV1(e)) // written before the flags byte
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
		again := appendRecord(nil, e)
		if v[0] == recordVersion2 && !bytes.Equal(again, v) {
			t.Fatalf("re-encode differs:\n got %x\nwant %x", again, v)
		}
		if back, err := decodeRecord(k, again); v[0] == recordVersion1 && (err != nil || back != e || e.Demoted) {
			t.Fatalf("a version-1 record %+v: rewritten and read back %+v, %v", e, back, err)
		}
	})
}
