package pagekey

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// Size is the length of a key and of a layout fingerprint in bytes.
const Size = 16

// Key identifies one page: the chained hash of its layout and every token up
// to and including the page.
type Key [Size]byte

// Fingerprint identifies a Layout.
type Fingerprint [Size]byte

// String returns the key in hex.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// ErrKeySize reports a key of the wrong length.
var ErrKeySize = errors.New("page key must be 16 bytes")

// FromBytes converts a 16-byte slice to a Key.
func FromBytes(b []byte) (Key, error) {
	var k Key
	if len(b) != Size {
		return k, fmt.Errorf("%w, got %d", ErrKeySize, len(b))
	}
	copy(k[:], b)
	return k, nil
}

// Layout is what makes KV bytes interchangeable (DESIGN.md §2).
type Layout struct {
	Model      string `json:"model"`
	Revision   string `json:"revision"`
	DType      string `json:"dtype"`
	NumLayers  uint32 `json:"num_layers"`
	KVHeads    uint32 `json:"kv_heads"`
	HeadDim    uint32 `json:"head_dim"`
	TPRank     uint32 `json:"tp_rank"`
	TPSize     uint32 `json:"tp_size"`
	PageTokens uint32 `json:"page_tokens"`
	ByteLayout string `json:"byte_layout"`
}

// Fingerprint returns the layout's fingerprint.
func (l Layout) Fingerprint() Fingerprint {
	h := sha256.New()
	h.Write([]byte("orbitkv.layout.v1"))
	var u [4]byte
	str := func(s string) {
		binary.LittleEndian.PutUint32(u[:], uint32(len(s)))
		h.Write(u[:])
		h.Write([]byte(s))
	}
	num := func(v uint32) {
		binary.LittleEndian.PutUint32(u[:], v)
		h.Write(u[:])
	}
	str(l.Model)
	str(l.Revision)
	str(l.DType)
	for _, v := range []uint32{l.NumLayers, l.KVHeads, l.HeadDim, l.TPRank, l.TPSize, l.PageTokens} {
		num(v)
	}
	str(l.ByteLayout)
	var fp Fingerprint
	copy(fp[:], h.Sum(nil))
	return fp
}

// Next returns the key of the page that follows prev and holds tokens.
func Next(fp Fingerprint, prev Key, tokens []uint32) Key {
	return NextExtra(fp, prev, tokens, nil)
}

// NextExtra returns the key of the page that follows prev, holds tokens and
// carries the encoded extras extra (PageExtras.Encode; nil or empty for a
// page without extras, whose key is then Next's).
func NextExtra(fp Fingerprint, prev Key, tokens []uint32, extra []byte) Key {
	buf := make([]byte, 2*Size+4*len(tokens), 2*Size+4*len(tokens)+len(extra))
	copy(buf, fp[:])
	copy(buf[Size:], prev[:])
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[2*Size+4*i:], t)
	}
	buf = append(buf, extra...)
	sum := sha256.Sum256(buf)
	var k Key
	copy(k[:], sum[:Size])
	return k
}

// Chain returns the keys of every whole page of tokens.
func Chain(fp Fingerprint, pageTokens int, tokens []uint32) []Key {
	if pageTokens <= 0 {
		return nil
	}
	n := len(tokens) / pageTokens
	keys := make([]Key, n)
	var prev Key
	for i := 0; i < n; i++ {
		prev = Next(fp, prev, tokens[i*pageTokens:(i+1)*pageTokens])
		keys[i] = prev
	}
	return keys
}

// ChainExtras returns the keys of every whole page of tokens under the
// request's extras (nil: Chain's keys). It fails where the extras cannot be
// keyed (RequestExtras.Page).
func ChainExtras(fp Fingerprint, pageTokens int, tokens []uint32, x *RequestExtras) ([]Key, error) {
	if pageTokens <= 0 {
		return nil, nil
	}
	n := len(tokens) / pageTokens
	keys := make([]Key, n)
	var prev Key
	for i := 0; i < n; i++ {
		var extra []byte
		if x != nil {
			pe, err := x.Page(i, pageTokens)
			if err != nil {
				return nil, err
			}
			extra = pe.Encode()
		}
		prev = NextExtra(fp, prev, tokens[i*pageTokens:(i+1)*pageTokens], extra)
		keys[i] = prev
	}
	return keys, nil
}

// dtypeBytes is the element size of the dtypes a layout may name.
var dtypeBytes = map[string]uint64{"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp32": 4, "float32": 4,
	"fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1}

// DTypeBytes is the element size of a dtype a layout may name; false for any other.
func DTypeBytes(dtype string) (uint64, bool) {
	n, ok := dtypeBytes[dtype]
	return n, ok
}
