package catalog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Persisted records. Key: recordPrefix ‖ 16-byte page key. Value, version 1,
// little-endian, fixed length:
//
//	off len field
//	  0   1 version (1)
//	  1  16 layout fingerprint
//	 17   8 size
//	 25   4 checksum (of the page data)
//	 29   8 generation
//	 37   4 SSD file
//	 41   8 SSD offset
//	 49   8 SSD bytes
//	 57   8 last access (unix ns)
//	 65   8 hits
//	 73   4 CRC-32C (Castagnoli) over the record key and value bytes [0, 73)
//
// Version 2 (written since 2026-12-01) is version 1 with the version byte 2
// and one flags byte at 73 (bit 0: Demoted; the others zero), its CRC-32C
// at 74 over [0, 74). Version 1 records decode with Demoted false.
//
// Only OnSSD entries are persisted, so OnSSD is implied and DRAMSlot is -1
// on decode.
const (
	recordVersion1 = 1
	recordLenV1    = 77
	recordVersion2 = 2
	recordLenV2    = 78
	flagDemoted    = 1
	flagsOffset    = 73 // of the flags byte in a version-2 value
	recordPrefix   = "pg/"
	recordKeyLen   = len(recordPrefix) + pagekey.Size
)

// recordUpper is the exclusive upper bound of the record key space.
var recordUpper = []byte("pg0") // '0' follows '/'

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorruptRecord is wrapped by every decode failure of a persisted record.
var ErrCorruptRecord = errors.New("corrupt catalog record")

// appendRecordKey appends the persisted key of k to dst.
func appendRecordKey(dst []byte, k pagekey.Key) []byte {
	dst = append(dst, recordPrefix...)
	return append(dst, k[:]...)
}

// parseRecordKey returns the page key of a persisted record key.
func parseRecordKey(b []byte) (pagekey.Key, error) {
	var k pagekey.Key
	if len(b) != recordKeyLen || string(b[:len(recordPrefix)]) != recordPrefix {
		return k, fmt.Errorf("%w: key of %d bytes %q", ErrCorruptRecord, len(b), b)
	}
	copy(k[:], b[len(recordPrefix):])
	return k, nil
}

// appendRecord appends the version-2 value of e to dst. The CRC covers the
// record key too, so a value stored under the wrong key is detected.
func appendRecord(dst []byte, e Entry) []byte {
	start := len(dst)
	dst = append(dst, recordVersion2)
	dst = append(dst, e.Layout[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, e.Size)
	dst = binary.LittleEndian.AppendUint32(dst, e.Checksum)
	dst = binary.LittleEndian.AppendUint64(dst, e.Generation)
	dst = binary.LittleEndian.AppendUint32(dst, e.SSD.File)
	dst = binary.LittleEndian.AppendUint64(dst, e.SSD.Offset)
	dst = binary.LittleEndian.AppendUint64(dst, e.SSD.Bytes)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.LastAccess))
	dst = binary.LittleEndian.AppendUint64(dst, e.Hits)
	var flags byte
	if e.Demoted {
		flags |= flagDemoted
	}
	dst = append(dst, flags)
	return binary.LittleEndian.AppendUint32(dst, recordCRC(e.Key, dst[start:]))
}

func recordCRC(k pagekey.Key, body []byte) uint32 {
	var kb [recordKeyLen]byte
	crc := crc32.Update(0, castagnoli, appendRecordKey(kb[:0], k))
	return crc32.Update(crc, castagnoli, body)
}

// decodeRecord decodes the value persisted under page key k. Every failure
// wraps ErrCorruptRecord.
func decodeRecord(k pagekey.Key, v []byte) (Entry, error) {
	if len(v) == 0 {
		return Entry{}, fmt.Errorf("%w: empty value", ErrCorruptRecord)
	}
	n := 0
	switch v[0] {
	case recordVersion1:
		n = recordLenV1
	case recordVersion2:
		n = recordLenV2
	default:
		return Entry{}, fmt.Errorf("%w: unknown version %d", ErrCorruptRecord, v[0])
	}
	if len(v) != n {
		return Entry{}, fmt.Errorf("%w: %d bytes, want %d", ErrCorruptRecord, len(v), n)
	}
	body, sum := v[:n-4], binary.LittleEndian.Uint32(v[n-4:])
	if got := recordCRC(k, body); got != sum {
		return Entry{}, fmt.Errorf("%w: crc %08x, want %08x", ErrCorruptRecord, got, sum)
	}
	if n == recordLenV2 && v[flagsOffset]&^flagDemoted != 0 {
		return Entry{}, fmt.Errorf("%w: unknown flags %#x", ErrCorruptRecord, v[flagsOffset])
	}
	le := binary.LittleEndian
	e := Entry{Key: k, DRAMSlot: -1, OnSSD: true}
	copy(e.Layout[:], v[1:17])
	e.Size = le.Uint64(v[17:])
	e.Checksum = le.Uint32(v[25:])
	e.Generation = le.Uint64(v[29:])
	e.SSD.File = le.Uint32(v[37:])
	e.SSD.Offset = le.Uint64(v[41:])
	e.SSD.Bytes = le.Uint64(v[49:])
	e.LastAccess = int64(le.Uint64(v[57:]))
	e.Hits = le.Uint64(v[65:])
	e.Demoted = n == recordLenV2 && v[flagsOffset]&flagDemoted != 0
	return e, nil
}
