// Package tiers holds the peer's storage tiers and the pure policies that
// place and evict pages across them:
//
//   - dram/ — one pre-faulted, aligned pool allocated at start, carved into
//     page slots;
//   - ssd/  — preallocated O_DIRECT files written and read through io_uring;
//   - LRU   — the eviction order of one tier, which never yields a pinned
//     (leased or in-copy) page;
//   - Frequency — how often each page was asked for lately (a count-min
//     sketch that ages), which judges readmissions into a full DRAM tier.
//
// Policies here are plain state machines with explicit inputs and no I/O;
// the peer (package fabric) drives them and moves the bytes.
package tiers
