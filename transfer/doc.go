// Package transfer moves page bytes: it plans descriptor batches between an
// engine's KV buffers (scattered (layer × plane) segments) and a page blob
// (one contiguous tier slot), and executes them on a Copier (this process's
// memory) or a Transport (another peer's).
//
// Invariants:
//   - A page blob is segment-major: for each segment in the session's order,
//     the page's blocks in sequence order. Gather and Scatter are exact
//     inverses for the same geometry and block list.
//   - Descriptors are bounds-checked against their regions when planned;
//     a Copier never sees an out-of-range descriptor.
//   - Adjacent descriptors that are contiguous on both sides are merged, so
//     engines whose blocks are contiguous move in few large copies.
//   - Engine memory is untrusted: Local copies run with memory faults
//     guarded (runtime/debug.SetPanicOnFault), so a region whose backing
//     vanished (an engine's shared-memory file shrunk under its mapping)
//     fails the batch with a *FaultError naming the region, never the
//     process (fault.go). A fault outside the batch's regions still crashes:
//     that is the peer's own bug.
//
// Copiers: Local (host memory, memmove) and CUDA (pinned DRAM pool ⇄ one
// GPU through a small pool of cuda.Copiers; every descriptor of an operation
// in one copier batch; CopyGroups lets a save checksum one group of pages
// while the next copies) live here. Between peers the Transport interface
// (transport.go: batched remote descriptors, Read and Write, per-descriptor
// completions, deadlines from the context) is implemented by the TCP data
// plane (transfer/tcp) and, later, RDMA verbs (rdma/); transfer/transporttest
// holds a fake that drops, delays, reorders or corrupts, and the contract
// suite every Transport passes.
package transfer
