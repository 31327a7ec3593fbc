package rdma

import (
	"errors"
	"fmt"
)

// ErrNoDevice reports that no usable RDMA device was found: libibverbs
// loaded but listed no device, or every device was filtered out by the
// allowlist or had no active port. The peer falls back to TCP.
var ErrNoDevice = errors.New("no RDMA device")

// ErrNoLibrary reports that libibverbs.so.1 could not be loaded. It wraps
// ErrNoDevice too: for the caller both mean "use TCP".
var ErrNoLibrary = fmt.Errorf("libibverbs not found: %w", ErrNoDevice)

// ErrDisabled reports RDMA turned off by configuration (--rdma-devices
// none). It wraps ErrNoDevice: the peer uses TCP.
var ErrDisabled = fmt.Errorf("rdma off (--rdma-devices none): %w", ErrNoDevice)

// ErrNotSupported is returned by every entry point of a build without cgo
// (CGO_ENABLED=0) or off Linux, and by features the loaded library lacks
// (ibv_reg_dmabuf_mr before rdma-core 34, GPUDirect without a dmabuf hook).
var ErrNotSupported = errors.New("rdma: not supported")

// ErrClosed reports use of an Engine, Region or Conn after Close.
var ErrClosed = errors.New("rdma: use of closed handle")

// ErrTimeout reports a batch that did not complete before its deadline. The
// work requests still in flight were flushed (their QP moved to the error
// state and drained) before the call returned.
var ErrTimeout = errors.New("rdma: batch deadline exceeded")

// ErrLaneDown reports that no lane of a connection can carry work: every
// QP failed and used up its reconnect budget (Config.MaxReconnects). The
// caller should fall back to TCP for that member.
var ErrLaneDown = errors.New("rdma: no usable lane")

// ErrBadConnInfo reports connection data that does not decode or does not
// match this engine (a lane count, MTU, QPN or region out of range).
var ErrBadConnInfo = errors.New("rdma: bad connection data")

// VerbsError is a failed verbs call: the operation and the errno it set.
type VerbsError struct {
	Op    string // what was being done, e.g. "ibv_modify_qp RTR mlx5_0 qpn 0x1a2"
	Errno int    // errno (or the negative return value, made positive)
}

func (e *VerbsError) Error() string {
	return fmt.Sprintf("rdma: %s: errno %d (%s)", e.Op, e.Errno, errnoName(e.Errno))
}

// CompletionError is a work request that completed with an error status.
type CompletionError struct {
	Device    string   // the local NIC of the lane
	Status    WCStatus // the completion's status
	VendorErr uint32   // the provider's vendor error syndrome
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("rdma: work completion on %s: %s (vendor 0x%x)", e.Device, e.Status, e.VendorErr)
}
