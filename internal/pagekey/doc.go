// Package pagekey defines OrbitKV's layout fingerprints and chained page keys
// (DESIGN.md §2). Go and Python compute identical keys; testdata/vectors.json
// holds the shared test vectors that both sides check.
//
// Layout fingerprint: the first 16 bytes of SHA-256 over
//
//	"orbitkv.layout.v1" ‖ str(model) ‖ str(revision) ‖ str(dtype) ‖
//	u32(num_layers) ‖ u32(kv_heads) ‖ u32(head_dim) ‖ u32(tp_rank) ‖
//	u32(tp_size) ‖ u32(page_tokens) ‖ str(byte_layout)
//
// where u32 is little-endian and str(s) is u32(len(s)) followed by the UTF-8
// bytes of s.
//
// Page keys: key[-1] is 16 zero bytes and
//
//	key[i] = SHA-256(fp ‖ key[i-1] ‖ tokens of page i as little-endian u32 ‖ extra(i))[:16]
//
// Only whole pages have keys; a trailing partial page is never keyed. Every
// page holds exactly page_tokens tokens (the fingerprint commits to it), so
// where the tokens end and extra(i) begins is never in doubt.
//
// Extras (extras.go) are what, beside its tokens, makes a request's KV
// differ from another's with the same tokens — what vLLM's own prefix cache
// keys a block on: the LoRA adapter, multimodal inputs, the cache salt,
// prompt embeddings. extra(i) is empty for a page without extras, so the
// keys of a request without any are unchanged; otherwise
//
//	extra(i) = "orbitkv.extra.v1" ‖ u32(count) ‖ item…
//	item     = u8(kind) ‖ u32(len(body)) ‖ body
//
// with the items in this order:
//
//	1 LoRA      str(name) ‖ str(path)                         on every page
//	2 MM input  str(id) ‖ i64(offset − page start) ‖ u64(length)
//	            each input whose placeholder range [offset, offset+length)
//	            overlaps the page, in order of offset (a stable sort)
//	3 salt      str(cache_salt)                               page 0 only, a non-empty salt
//	4 embeds    the 32-byte SHA-256 of the page's prompt-embedding bytes
//
// A page an image's placeholders fall in carries its id and position; every
// later page depends on it through key[i-1], as on the salt. Extras that
// cannot be keyed (an input without an id, a missing embeddings hash) are
// ErrExtras: the engine side treats the request as a miss and saves nothing.
package pagekey
