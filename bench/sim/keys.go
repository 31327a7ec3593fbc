package sim

import (
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// uniqueBlock marks content past the trace's hash ids, unique to a request.
// It sits where a hash id's high word goes, which no id (non-negative, 63
// bits) can fill.
const uniqueBlock = ^uint32(0)

// PageKeys returns the key chain of req's whole pages. A page hashes the
// (block id, offset, length) spans of the BlockTokens blocks it covers, which
// is what synthesizing each block's tokens from its hash id would give: equal
// ids at equal positions give equal keys, and keys chain, so a common prefix
// of pages is a common prefix of keys.
func PageKeys(fp pagekey.Fingerprint, pageTokens int, req Request) []pagekey.Key {
	n := req.InputTokens / pageTokens
	keys := make([]pagekey.Key, n)
	var prev pagekey.Key
	words := make([]uint32, 0, 16)
	for p := range n {
		words = pageWords(words[:0], req, p*pageTokens, (p+1)*pageTokens)
		prev = pagekey.Next(fp, prev, words)
		keys[p] = prev
	}
	return keys
}

// pageWords appends the spans of tokens [from, to) of req, one
// (id lo, id hi, offset in block, length) quadruple per block touched, or
// (request, uniqueBlock, position, length) past the last id.
func pageWords(w []uint32, req Request, from, to int) []uint32 {
	for at := from; at < to; {
		b := at / BlockTokens
		end := min(to, (b+1)*BlockTokens)
		off, length := uint32(at-b*BlockTokens), uint32(end-at)
		if b < len(req.HashIDs) {
			id := uint64(req.HashIDs[b])
			w = append(w, uint32(id), uint32(id>>32), off, length)
		} else {
			w = append(w, uint32(req.Index), uniqueBlock, uint32(at), length)
		}
		at = end
	}
	return w
}
