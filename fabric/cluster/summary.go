package cluster

import (
	"encoding/binary"
	"fmt"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// The compact catalog (Config.CompactCatalog): a peer publishes a filter
// of its page keys (catalog.Summary: a blocked Bloom filter of a few bits
// a page) instead of every page. A change of its catalog changes a few
// bits; each changed bit is one announcement, numbered in the peer's
// sequence like a page's (cluster.go: in order, duplicates ignored, a
// hole repaired by a snapshot), so a member's copy of the filter is
// exactly the peer's once it caught up. A snapshot is the filter itself.
// When the peer outgrows its filter it builds a larger one and announces
// a reset: members take a snapshot.
//
//	flips: 'F' | version u8 | name | incarnation u64 | first seq u64 |
//	       count u16 | count × u32 (bit | 1<<31 when set; 0xFFFFFFFF: reset)

// ownSummary is this peer's published filter and the keys it holds (the
// keys make Added and Deleted exact, and let the filter be rebuilt
// larger). Guarded by Cluster.out.
type ownSummary struct {
	s    *catalog.Summary
	keys map[pagekey.Key]struct{}
}

func newOwnSummary(keys map[pagekey.Key]struct{}) *ownSummary {
	o := &ownSummary{s: catalog.NewSummary(len(keys) * 5 / 4), keys: keys}
	for k := range keys {
		o.s.Add(k, nil)
	}
	return o
}

// add counts k in; grown says the filter was rebuilt larger (no flips then:
// members take a snapshot).
func (o *ownSummary) add(k pagekey.Key) (flips []catalog.Flip, grown bool) {
	if _, ok := o.keys[k]; ok {
		return nil, false
	}
	o.keys[k] = struct{}{}
	if len(o.keys) > o.s.Capacity() {
		*o = *newOwnSummary(o.keys)
		return nil, true
	}
	return o.s.Add(k, nil), false
}

func (o *ownSummary) remove(k pagekey.Key) []catalog.Flip {
	if _, ok := o.keys[k]; !ok {
		return nil
	}
	delete(o.keys, k)
	return o.s.Remove(k, nil)
}

func flipAnnouncements(flips []catalog.Flip) []announcement {
	anns := make([]announcement, len(flips))
	for i, f := range flips {
		anns[i] = announcement{op: opClear, bit: f.Bit}
		if f.Set {
			anns[i].op = opSet
		}
	}
	return anns
}

// encodeFlips packs flip announcements, numbered from first, into messages
// of at most maxAnnounceBytes.
func encodeFlips(name string, incarnation, first uint64, anns []announcement) [][]byte {
	var out [][]byte
	for len(anns) > 0 {
		msg := appendHead(nil, gossipHead{kind: msgFlips, name: name, incarnation: incarnation, seq: first})
		n := min(len(anns), (maxAnnounceBytes-len(msg)-2)/4, 0xffff)
		msg = binary.LittleEndian.AppendUint16(msg, uint16(n))
		for _, a := range anns[:n] {
			msg = binary.LittleEndian.AppendUint32(msg, a.flipWire())
		}
		out = append(out, msg)
		anns, first = anns[n:], first+uint64(n)
	}
	return out
}

func (a announcement) flipWire() uint32 {
	switch a.op {
	case opReset:
		return flipReset
	case opSet:
		return a.bit | flipSet
	}
	return a.bit
}

// decodeFlips parses the body of a flips message.
func decodeFlips(b []byte) ([]announcement, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: no count", errGossip)
	}
	n := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	if n == 0 || len(b) != 4*n {
		return nil, fmt.Errorf("%w: %d flips in %d bytes", errGossip, n, len(b))
	}
	anns := make([]announcement, n)
	for i := range anns {
		w := binary.LittleEndian.Uint32(b[4*i:])
		switch {
		case w == flipReset:
			anns[i].op = opReset
		case w&flipSet != 0:
			anns[i] = announcement{op: opSet, bit: w &^ flipSet}
		default:
			anns[i] = announcement{op: opClear, bit: w}
		}
	}
	return anns, nil
}

// appendFilter appends f's words, little-endian (a snapshot's entries).
func appendFilter(dst []byte, f catalog.Filter) []byte {
	for _, w := range f {
		dst = binary.LittleEndian.AppendUint64(dst, w)
	}
	return dst
}

// decodeFilter parses a compact snapshot's entries.
func decodeFilter(b []byte) (catalog.Filter, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("%w: summary of %d bytes", errGossip, len(b))
	}
	f := make(catalog.Filter, len(b)/8)
	for i := range f {
		f[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return f, nil
}
