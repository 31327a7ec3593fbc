package catalog

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// MaxOrigins is how many peers a Remote index tells apart. Origin ids are
// 0..MaxOrigins-1; the fabric assigns them to members, lowest free first,
// and reuses the ids of peers that left.
const MaxOrigins = 4096

// ErrOrigin reports an origin id out of range.
var ErrOrigin = errors.New("origin id out of range")

// Inline forms of Holders.
const (
	// smallHolders is how many ids a Holders keeps inline as a list. A page
	// is mostly held by one member or a few; a larger set with an id past
	// inlineBits spills to words.
	smallHolders = 8
	// inlineBits: a set of ids below it only is inline as bits, whatever
	// its size (a cluster of up to 127 members never spills).
	inlineBits = smallHolders*16 - 1
	bitsFlag   = 1 << 15 // small[smallHolders-1]'s top bit: small is bits
)

// Holders is a set of origin ids. The zero value is empty.
//
// It takes one of three forms, decided by its ids alone: a set of ids
// below inlineBits only is inline bits (bit o of small, bitsFlag set); else
// a set of up to smallHolders ids is an inline list (id+1 each, ascending,
// 0 for a free slot); else it is words, one bit per id, as many words as
// its highest id needs. The words may be shared by copies of the value:
// they are never written once set (Add and Remove copy them), so a copy is
// a snapshot that no later change of the original touches.
type Holders struct {
	small [smallHolders]uint16
	big   []uint64
}

// HoldersOf returns the set of the given origins.
func HoldersOf(origins ...int) (Holders, error) {
	var h Holders
	for _, o := range origins {
		if err := h.Add(o); err != nil {
			return Holders{}, err
		}
	}
	return h, nil
}

func (h *Holders) isBits() bool { return h.small[smallHolders-1]&bitsFlag != 0 }

// inline returns the inline bits as words (bitsFlag cleared).
func (h *Holders) inline() [2]uint64 {
	var w [2]uint64
	for i, s := range h.small {
		w[i/4] |= uint64(s) << (16 * (i % 4))
	}
	w[1] &^= bitsFlag << 48
	return w
}

// Has says whether o is in h.
func (h *Holders) Has(o int) bool {
	if u := uint(o); h.small[smallHolders-1]&bitsFlag != 0 && u < inlineBits {
		return h.small[u>>4&7]>>(u&15)&1 != 0 // inline bits: most sets
	}
	return h.has(o)
}

func (h *Holders) has(o int) bool {
	switch {
	case o < 0 || o >= MaxOrigins:
		return false
	case h.big != nil:
		return o>>6 < len(h.big) && h.big[o>>6]&(1<<(o&63)) != 0
	case h.isBits():
		return o < inlineBits && h.small[o>>4]&(1<<(o&15)) != 0
	}
	for _, s := range h.small {
		if int(s) == o+1 {
			return true
		}
	}
	return false
}

// Empty says whether h holds no origin.
func (h *Holders) Empty() bool { return h.big == nil && h.small == [smallHolders]uint16{} }

// Count returns how many origins h holds.
func (h *Holders) Count() (n int) {
	switch {
	case h.big != nil:
		return onesCount(h.big)
	case h.isBits():
		w := h.inline()
		return onesCount(w[:])
	}
	for _, s := range h.small {
		if s != 0 {
			n++
		}
	}
	return n
}

func onesCount(w []uint64) (n int) {
	for _, x := range w {
		n += bits.OnesCount64(x)
	}
	return n
}

// First returns the lowest origin in h, or -1.
func (h *Holders) First() int { return h.Next(-1) }

// Next returns the lowest origin in h above o, or -1.
func (h *Holders) Next(o int) int {
	o = max(o+1, 0)
	switch {
	case h.big != nil:
		return nextBit(h.big, o)
	case h.isBits():
		w := h.inline()
		return nextBit(w[:], o)
	}
	for _, s := range h.small {
		if s != 0 && int(s)-1 >= o {
			return int(s) - 1
		}
	}
	return -1
}

// nextBit returns the lowest bit set in w from o on, or -1.
func nextBit(w []uint64, o int) int {
	for i := o >> 6; i < len(w); i++ {
		x := w[i]
		if i == o>>6 {
			x &^= 1<<(o&63) - 1
		}
		if x != 0 {
			return i*64 + bits.TrailingZeros64(x)
		}
	}
	return -1
}

// Add puts o in h.
func (h *Holders) Add(o int) error {
	if o < 0 || o >= MaxOrigins {
		return fmt.Errorf("%w: %d (0..%d)", ErrOrigin, o, MaxOrigins-1)
	}
	switch {
	case h.Has(o):
	case o < inlineBits && (h.isBits() || h.Empty()):
		h.small[o>>4] |= 1 << (o & 15)
		h.small[smallHolders-1] |= bitsFlag
	case h.big != nil:
		w := make([]uint64, max(len(h.big), o>>6+1))
		copy(w, h.big)
		w[o>>6] |= 1 << (o & 63)
		h.big = w
	case !h.isBits() && h.small[smallHolders-1] == 0:
		// A list with room (an id past inlineBits is in it, or will be).
		i := 0
		for h.small[i] != 0 && int(h.small[i]) < o+1 {
			i++
		}
		copy(h.small[i+1:], h.small[i:smallHolders-1])
		h.small[i] = uint16(o + 1)
	default:
		*h = holdersFrom(append(h.ids(), o))
	}
	return nil
}

// Remove takes o out of h.
func (h *Holders) Remove(o int) {
	switch {
	case !h.Has(o):
	case h.isBits():
		h.small[o>>4] &^= 1 << (o & 15)
		if h.small == [smallHolders]uint16{smallHolders - 1: bitsFlag} {
			*h = Holders{}
		}
	case h.big != nil:
		w := append([]uint64(nil), h.big...)
		w[o>>6] &^= 1 << (o & 63)
		for len(w) > 0 && w[len(w)-1] == 0 {
			w = w[:len(w)-1]
		}
		n := Holders{big: w}
		if n.Count() > smallHolders && nextBit(w, inlineBits) >= 0 {
			*h = n // still more than a list holds, and an id past inlineBits
			return
		}
		*h = holdersFrom(n.ids())
	default:
		*h = holdersFrom(slices.DeleteFunc(h.ids(), func(x int) bool { return x == o }))
	}
}

// ids lists h's origins, ascending.
func (h *Holders) ids() []int {
	var out []int
	for o := h.First(); o >= 0; o = h.Next(o) {
		out = append(out, o)
	}
	return out
}

// holdersFrom returns the set of ids (valid, distinct) in its form.
func holdersFrom(ids []int) Holders {
	var h Holders
	top := -1
	for _, o := range ids {
		top = max(top, o)
	}
	switch {
	case len(ids) == 0:
	case top < inlineBits:
		for _, o := range ids {
			h.small[o>>4] |= 1 << (o & 15)
		}
		h.small[smallHolders-1] |= bitsFlag
	case len(ids) <= smallHolders:
		slices.Sort(ids)
		for i, o := range ids {
			h.small[i] = uint16(o + 1)
		}
	default:
		h.big = make([]uint64, top>>6+1)
		for _, o := range ids {
			h.big[o>>6] |= 1 << (o & 63)
		}
	}
	return h
}

// String lists h's origins, ascending.
func (h Holders) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for o := h.First(); o >= 0; o = h.Next(o) {
		if b.Len() > 1 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(o))
	}
	b.WriteByte(']')
	return b.String()
}
