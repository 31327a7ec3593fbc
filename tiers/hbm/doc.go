// Package hbm holds the engine-registered KV buffers a peer copies pages in
// and out of: a shared-memory file for CPU engines (mapped here), and GPU
// allocations imported from CUDA IPC handles (package cuda) for GPU engines.
//
// A mapped buffer lives exactly as long as the session that registered it;
// the peer unmaps it only after every copy touching it has finished. The
// engine may still shrink the file under the mapping: Shared keeps the file
// open so Check can fstat it before each operation (a copy racing a shrink
// faults, and the transfer package turns that fault into an error).
package hbm
