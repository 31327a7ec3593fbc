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
//	key[i] = SHA-256(fp ‖ key[i-1] ‖ tokens of page i as little-endian u32)[:16]
//
// Only whole pages have keys; a trailing partial page is never keyed.
package pagekey
