// Package sim replays a request trace in the Mooncake FAST'25 format
// (timestamp ms, input_length, output_length, hash_ids per 512-token block)
// against the peer's real catalog (catalog.Catalog, in memory) and real
// eviction order (tiers.LRU with pins), for N hosts, in virtual time. It
// answers "what would OrbitKV's tiers hit, move and save on this workload at
// these capacities" without a GPU. It is a model, not a measurement.
//
// # What is modeled
//
//   - Pages: PageTokens consecutive tokens. Keys are pagekey chains; a page's
//     hashed content is the list of (hash id, offset, length) spans of the
//     trace blocks it covers, so equal hash ids at equal positions give equal
//     keys and a prefix match is a prefix (traces/README.md). Tokens past the
//     last hash id are unique to the request. Only whole pages are cached;
//     the tail of the prompt is always computed.
//   - Per host: an engine prefix cache in HBM (a tiers.LRU of pages, capacity
//     HBMTokens, tail of a request evicted first like vLLM's free order), and
//     the peer's DRAM and SSD tiers with byte capacities. The tier code mirrors
//     fabric's page store (fabric/store/evict.go): a save or SSD-hit promotion needs a
//     DRAM slot; a full DRAM drops its oldest unpinned copy that needs no I/O
//     (already on SSD), or else demotes up to 16 of its oldest pages to SSD
//     together; a full SSD drops its LRU unpinned copies 16 at a time. A page
//     promoted from SSD keeps its SSD copy. The catalog is the record of
//     which tier holds what, updated with Put/Update/Delete as the peer does.
//   - A request on a host: the longest prefix in HBM, extended by the local
//     catalog (DRAM, SSD) and, with sharing, by other hosts' catalogs (remote),
//     alternating until no one holds the next page, and at most
//     (input_length-1)/PageTokens pages: an engine computes at least the last
//     prompt token, so the connector never asks for a fully cached prompt's
//     last page (vLLM's and the reference engine's rule). Hit pages are pinned (a
//     lease) from prefill start to its end, locally and on the remote owner.
//     After prefill, every whole page is saved: DRAM hits are kept, SSD hits
//     are promoted, remote and computed pages are written to local DRAM, all in
//     chain order (the order the peer's save batch touches them).
//   - Time: an event loop over arrivals and prefill completions, ordered by
//     virtual time (completions before arrivals at equal times, then by trace
//     order). Each host runs one prefill at a time, FCFS. TTFT = queueing +
//     load of the hit pages + prefill of the missed tokens. Load time is the
//     sum over paths of bytes / bandwidth (DRAM→HBM, SSD→HBM, remote→HBM at the
//     lesser of the network and the owner's tier bandwidth); prefill time is
//     linear in missed tokens.
//   - Routing: round-robin, least-loaded (least estimated queued work), or
//     prefix-affinity (least estimated TTFT: queued work plus prefill of the
//     tokens the host does not hold locally in HBM, DRAM or SSD).
//
// # What is ignored
//
// Decode (output tokens neither occupy HBM nor interfere with prefill),
// batching of several prefills on one GPU, overlap of page loads with compute
// (layer-wise loading) and of one request's load with another's prefill,
// attention's quadratic cost (prefill is linear in missed tokens, and a
// cached prefix costs nothing to attend to), network and PCIe contention
// between concurrent transfers, gossip delay (a saved page is visible to
// every host at once), SSD write bandwidth for demotions (they are counted
// in bytes, not in time), lookup and RPC latency, failures and checksums,
// and engine memory outside the prefix cache. Hash ids are taken as exact
// token identity. The model is deterministic: the same trace and config give
// the same result.
package sim
