package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Gossip messages (memberlist user messages and push/pull state). Every
// message names its origin peer and that peer's incarnation (a random number
// drawn at each start); announcements carry consecutive sequence numbers so
// a receiver sees what it missed (cluster.go).
//
//	announce: 'A' | version u8 | name | incarnation u64 | first seq u64 |
//	          count u16 | count × (op u8 | key [16] | if have: layout [16] | size u64)
//	state:    'S' | version u8 | name | incarnation u64 | seq u64
//	name:     length u8 | bytes
const (
	msgAnnounce = 'A'
	msgState    = 'S'
	gossipV1    = 1

	opHave = 1
	opDrop = 2

	// maxAnnounceBytes keeps an announcement inside one UDP packet with room
	// for memberlist's framing, label and encryption.
	maxAnnounceBytes = 1100
	maxNameLen       = 200
)

const (
	msgFlips = 'F'

	opSet   = 3 // a bit of the summary became set
	opClear = 4 // a bit became clear
	opReset = 5 // the summary was rebuilt (another size): take a snapshot

	flipSet   = 1 << 31
	flipReset = 0xFFFFFFFF
)

var errGossip = errors.New("malformed gossip message")

// announcement is one have/drop of a page.
type announcement struct {
	op     uint8
	bit    uint32 // opSet, opClear: the summary's bit
	key    pagekey.Key
	layout pagekey.Fingerprint
	size   uint64
}

func announceOf(e catalog.Entry, ch catalog.Change) (announcement, bool) {
	switch ch {
	case catalog.Added:
		return announcement{op: opHave, key: e.Key, layout: e.Layout, size: e.Size}, true
	case catalog.Deleted:
		return announcement{op: opDrop, key: e.Key}, true
	}
	return announcement{}, false
}

func (a announcement) wireLen() int {
	if a.op == opHave {
		return 1 + 16 + 16 + 8
	}
	return 1 + 16
}

// gossipHead is what every message starts with.
type gossipHead struct {
	kind        byte
	name        string
	incarnation uint64
	seq         uint64 // announce: the first announcement's; state: the last sent
}

func appendHead(dst []byte, h gossipHead) []byte {
	dst = append(dst, h.kind, gossipV1, byte(len(h.name)))
	dst = append(dst, h.name...)
	dst = binary.LittleEndian.AppendUint64(dst, h.incarnation)
	return binary.LittleEndian.AppendUint64(dst, h.seq)
}

// encodeAnnouncements packs anns, numbered from first, into messages of at
// most maxAnnounceBytes.
func encodeAnnouncements(name string, incarnation, first uint64, anns []announcement) [][]byte {
	var out [][]byte
	for len(anns) > 0 {
		msg := appendHead(nil, gossipHead{kind: msgAnnounce, name: name, incarnation: incarnation, seq: first})
		countAt := len(msg)
		msg = append(msg, 0, 0)
		n := 0
		for n < len(anns) && len(msg)+anns[n].wireLen() <= maxAnnounceBytes && n < 0xffff {
			a := anns[n]
			msg = append(msg, a.op)
			msg = append(msg, a.key[:]...)
			if a.op == opHave {
				msg = append(msg, a.layout[:]...)
				msg = binary.LittleEndian.AppendUint64(msg, a.size)
			}
			n++
		}
		binary.LittleEndian.PutUint16(msg[countAt:], uint16(n))
		out = append(out, msg)
		anns, first = anns[n:], first+uint64(n)
	}
	return out
}

func encodeState(name string, incarnation, seq uint64) []byte {
	return appendHead(nil, gossipHead{kind: msgState, name: name, incarnation: incarnation, seq: seq})
}

// decodeHead parses a message's head and returns the rest.
func decodeHead(b []byte) (gossipHead, []byte, error) {
	var h gossipHead
	if len(b) < 3 {
		return h, nil, fmt.Errorf("%w: %d bytes", errGossip, len(b))
	}
	if b[0] != msgAnnounce && b[0] != msgState && b[0] != msgFlips || b[1] != gossipV1 {
		return h, nil, fmt.Errorf("%w: kind %q version %d", errGossip, b[0], b[1])
	}
	h.kind = b[0]
	n := int(b[2])
	b = b[3:]
	if n == 0 || n > maxNameLen || len(b) < n+16 {
		return h, nil, fmt.Errorf("%w: name of %d bytes", errGossip, n)
	}
	h.name = string(b[:n])
	h.incarnation = binary.LittleEndian.Uint64(b[n:])
	h.seq = binary.LittleEndian.Uint64(b[n+8:])
	return h, b[n+16:], nil
}

// decodeAnnouncements parses the body of an announce message.
func decodeAnnouncements(b []byte) ([]announcement, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: no count", errGossip)
	}
	n := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	if n == 0 || n > len(b)/17 {
		return nil, fmt.Errorf("%w: %d announcements in %d bytes", errGossip, n, len(b))
	}
	anns := make([]announcement, n)
	for i := range anns {
		if len(b) < 17 {
			return nil, fmt.Errorf("%w: announcement %d truncated", errGossip, i)
		}
		a := &anns[i]
		a.op = b[0]
		copy(a.key[:], b[1:17])
		b = b[17:]
		switch a.op {
		case opDrop:
		case opHave:
			if len(b) < 24 {
				return nil, fmt.Errorf("%w: announcement %d truncated", errGossip, i)
			}
			copy(a.layout[:], b[:16])
			a.size = binary.LittleEndian.Uint64(b[16:])
			b = b[24:]
			if a.size == 0 {
				return nil, fmt.Errorf("%w: page %s of 0 bytes", errGossip, a.key)
			}
		default:
			return nil, fmt.Errorf("%w: op %d", errGossip, a.op)
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errGossip, len(b))
	}
	return anns, nil
}

// Snapshot entries (peer.proto SnapshotChunk.entries): key | layout | size.
const snapshotEntrySize = 16 + 16 + 8

func appendSnapshotEntry(dst []byte, e catalog.Entry) []byte {
	dst = append(dst, e.Key[:]...)
	dst = append(dst, e.Layout[:]...)
	return binary.LittleEndian.AppendUint64(dst, e.Size)
}

func decodeSnapshotEntries(b []byte) ([]announcement, error) {
	if len(b)%snapshotEntrySize != 0 {
		return nil, fmt.Errorf("%w: snapshot chunk of %d bytes", errGossip, len(b))
	}
	anns := make([]announcement, len(b)/snapshotEntrySize)
	for i := range anns {
		e := b[i*snapshotEntrySize:]
		a := &anns[i]
		a.op = opHave
		copy(a.key[:], e[:16])
		copy(a.layout[:], e[16:32])
		a.size = binary.LittleEndian.Uint64(e[32:])
		if a.size == 0 {
			return nil, fmt.Errorf("%w: page %s of 0 bytes", errGossip, a.key)
		}
	}
	return anns, nil
}
