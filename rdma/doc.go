// Package rdma is OrbitKV's binding to RDMA verbs: device discovery, a
// protection domain per NIC, memory registration (the DRAM pool, and engine
// HBM through dmabuf for GPUDirect), RC queue pairs striped over several
// NICs, and batched RDMA READ (scattered into the destination) and WRITE
// with per-operation results and deadlines.
//
// # Loading
//
// libibverbs.so.1 is opened with dlopen at Open and its entry points
// resolved with dlvsym into a small C shim (shim.c); nothing links against
// libibverbs (ldd bin/orbitkv does not list it) and no verbs header is
// needed to build: verbs_abi.h declares the handful of structures the shim
// touches, and abi_test.go checks them field by field against
// <infiniband/verbs.h> where libibverbs-dev is installed. ibv_post_send and
// ibv_poll_cq are inline functions in verbs.h, so the shim calls them
// through the context's ops table as verbs.h does. Without the library Open
// returns ErrNoLibrary ("libibverbs not found"), without a usable device
// ErrNoDevice ("no RDMA device"); errors.Is(err, ErrNoDevice) holds for
// both, and the peer uses TCP. Built with CGO_ENABLED=0 Open returns
// ErrNotSupported (wrapping ErrNoDevice).
//
// # Invariants
//
//  1. Every wait has a deadline: a batch whose context has none gets
//     Config.Timeout; completions are polled, never waited for blindly.
//  2. Read and Write never return while a NIC may still write into or read
//     from the local segments: at the deadline the lanes with work in flight
//     are moved to ERR, their flushed completions drained (bounded by
//     Config.DrainTimeout), and a lane that still will not drain has its QP
//     and CQ destroyed. All of it ends by the caller's deadline: the work
//     is cut off early enough for the drain (DrainTimeout, or a quarter of
//     the batch's time when that is less).
//  3. Results are per operation: an op fails alone (bad range, error
//     completion after its retries); the others complete.
//  4. A lane whose QP failed is reset and reconnected through the
//     connection's Exchange before it is used again, at most
//     Config.MaxReconnects times in a row; after that it stays down and its
//     work goes to the other lanes. No lane up: ErrLaneDown (use TCP).
//  5. The path MTU is negotiated (the smaller of both ends' effective MTU),
//     and PSNs are random per connect, both carried in ConnInfo.
//  6. One batch per Conn at a time (its mutex); parallel batches use
//     several Conns. Work request IDs carry the batch number, so a stale
//     completion can never be taken for a new one.
//  7. Peers see only the regions registered with RemoteRead or RemoteWrite,
//     and each MR carries only the access asked for: a destination
//     (LocalOnly) is never in ConnInfo, and a RemoteRead region refuses a
//     WRITE at the responder's NIC.
//
// A batch in flight polls its CQs without blocking, yielding the processor
// between empty polls (runtime.Gosched): it keeps a core busy while it
// waits, as RDMA pollers do, and checks its deadline every 64 polls.
// Engine.Stats returns counters for the peer's metrics.
//
// # Connections
//
// Dial creates one lane (RC QP with its own CQ) per allowed NIC ×
// Config.QPsPerNIC, sends its ConnInfo through an Exchange (the peer gRPC
// service carries ConnInfo.Marshal bytes under mutual TLS) and gets the
// peer's, which the peer made with Accept. Each QP goes RESET → INIT → RTR
// → RTS (qpstate.go). Operations are cut into slices of at most
// Config.SliceBytes and Config.MaxSGE segments and striped round-robin over
// the lanes that are up (plan.go); completions come back in any order and
// are matched by work request ID (run.go).
//
// # The verbs seam and the fake
//
// All of the above talks to libibverbs through the unexported verbs
// interface (verbs.go). verbs_cgo.go is the real binding;
// binding_test.go runs the binding itself end to end against a stand-in
// libibverbs compiled from testdata/standin_ibverbs.c against the real
// verbs.h; fakeverbs_test.go is an in-memory FAKE of the seam, used by every
// test above the verbs calls: it moves bytes between fake devices, enforces the QP
// state machine, and can fail any call, complete out of order, return
// error completions or never complete. What the fake proves and what only
// hardware can is in docs/rdma.md.
//
// # Memory ownership
//
// Contexts, PDs, MRs, CQs and QPs live outside the Go heap and are released
// by the Close or Deregister of the Go value that created them; finalizers
// are never relied on. Registered host memory must not be Go heap memory.
package rdma
