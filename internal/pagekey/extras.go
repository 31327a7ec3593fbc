package pagekey

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
)

// extraDomain opens every encoded page extras block.
const extraDomain = "orbitkv.extra.v1"

// Kinds of items in a page's extras, in the order they are encoded.
const (
	ExtraLoRA   = 1 // the LoRA adapter: str(name) ‖ str(path)
	ExtraMM     = 2 // a multimodal input overlapping the page: str(id) ‖ i64(offset - page start) ‖ u64(length)
	ExtraSalt   = 3 // the request's cache salt (page 0 only): str(salt)
	ExtraEmbeds = 4 // SHA-256 of the page's prompt-embedding bytes (32 bytes)
)

// ErrExtras reports request extras that cannot be keyed; the engine side
// must then treat the request as a miss and save none of its pages.
var ErrExtras = errors.New("request extras cannot be keyed")

// LoRA names the adapter a request runs under: vLLM keys its own prefix
// cache on the name; the path (the adapter's weights) is keyed as well.
type LoRA struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// MMInput is one multimodal input of a request: its content hash (vLLM's
// mm feature identifier) and the prompt positions its placeholder tokens
// occupy, [Offset, Offset+Length).
type MMInput struct {
	ID     string `json:"id"`
	Offset uint64 `json:"offset"`
	Length uint64 `json:"length"`
}

// RequestExtras is what, beside its tokens, makes a request's KV differ
// from another's with the same tokens: what vLLM's own prefix cache keys
// its blocks on (generate_block_hash_extra_keys). The zero value has no
// extras: keys equal Chain's.
type RequestExtras struct {
	LoRA *LoRA     `json:"lora,omitempty"`
	MM   []MMInput `json:"mm,omitempty"`
	Salt string    `json:"salt,omitempty"` // "" = none (vLLM keys a non-empty salt only)
	// Embeds holds, per whole page, the hex SHA-256 of the page's
	// prompt-embedding bytes; empty when the request has no prompt embeds.
	Embeds []string `json:"embeds,omitempty"`
}

// PageMM is a multimodal input as one page sees it: Offset is relative to
// the page's first token (negative when the input began on an earlier page).
type PageMM struct {
	ID     string
	Offset int64
	Length uint64
}

// PageExtras is what one page's key covers beside its tokens.
type PageExtras struct {
	LoRA   *LoRA
	MM     []PageMM
	Salt   string
	Embeds []byte
}

// Page returns the extras of page i (tokens [i*pageTokens, (i+1)*pageTokens)):
// the LoRA on every page; each multimodal input whose placeholder range
// overlaps the page, in order of offset, with its offset relative to the
// page; the salt on page 0 only; the page's embeddings hash. Later pages
// depend on all of these through the chain.
func (x *RequestExtras) Page(i, pageTokens int) (PageExtras, error) {
	var p PageExtras
	if x == nil {
		return p, nil
	}
	p.LoRA = x.LoRA
	start := uint64(i) * uint64(pageTokens)
	end := start + uint64(pageTokens)
	mm := append([]MMInput(nil), x.MM...)
	sort.SliceStable(mm, func(a, b int) bool { return mm[a].Offset < mm[b].Offset })
	for _, m := range mm {
		if m.ID == "" {
			return p, fmt.Errorf("%w: a multimodal input without an id", ErrExtras)
		}
		if m.Offset > 1<<62 || m.Length > 1<<62 {
			return p, fmt.Errorf("%w: multimodal range %d+%d out of range", ErrExtras, m.Offset, m.Length)
		}
		if m.Offset < end && m.Offset+m.Length > start {
			p.MM = append(p.MM, PageMM{ID: m.ID, Offset: int64(m.Offset) - int64(start), Length: m.Length})
		}
	}
	if i == 0 {
		p.Salt = x.Salt
	}
	if len(x.Embeds) > 0 {
		if i >= len(x.Embeds) {
			return p, fmt.Errorf("%w: no embeddings hash for page %d", ErrExtras, i)
		}
		b, err := hex.DecodeString(x.Embeds[i])
		if err != nil || len(b) != 32 {
			return p, fmt.Errorf("%w: page %d's embeddings hash is not 32 hex bytes", ErrExtras, i)
		}
		p.Embeds = b
	}
	return p, nil
}

// Empty reports a page without extras.
func (p PageExtras) Empty() bool {
	return p.LoRA == nil && len(p.MM) == 0 && p.Salt == "" && len(p.Embeds) == 0
}

// Encode returns the bytes a page's key hashes after its tokens (doc.go):
// nil for a page without extras, else
//
//	"orbitkv.extra.v1" ‖ u32(count) ‖ item…, item = u8(kind) ‖ u32(len(body)) ‖ body
func (p PageExtras) Encode() []byte {
	if p.Empty() {
		return nil
	}
	var items [][]byte
	item := func(kind byte, body []byte) {
		b := make([]byte, 5, 5+len(body))
		b[0] = kind
		binary.LittleEndian.PutUint32(b[1:], uint32(len(body)))
		items = append(items, append(b, body...))
	}
	if p.LoRA != nil {
		item(ExtraLoRA, appendStr(appendStr(nil, p.LoRA.Name), p.LoRA.Path))
	}
	for _, m := range p.MM {
		b := appendStr(nil, m.ID)
		b = binary.LittleEndian.AppendUint64(b, uint64(m.Offset))
		b = binary.LittleEndian.AppendUint64(b, m.Length)
		item(ExtraMM, b)
	}
	if p.Salt != "" {
		item(ExtraSalt, appendStr(nil, p.Salt))
	}
	if len(p.Embeds) > 0 {
		item(ExtraEmbeds, p.Embeds)
	}
	out := append([]byte(extraDomain), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(out[len(extraDomain):], uint32(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

// appendStr appends u32(len(s)) ‖ s.
func appendStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
