package transfer

import (
	"context"
	"errors"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// ErrUnsupported reports a descriptor a transport cannot execute (e.g. device
// memory on the local transport, a WRITE on the TCP data plane).
var ErrUnsupported = errors.New("transport does not support this memory")

// ErrRemoteNotFound reports a remote region the other peer does not hold
// (any more): a page it dropped, or holds with another layout or size.
var ErrRemoteNotFound = errors.New("page not held by the remote peer")

// Copier executes descriptor batches between regions of this process:
// Local (host memory) and CUDA (pinned DRAM ⇄ one GPU). Copy returns when
// every descriptor is done or the context ends; a Copier must not touch the
// regions after Copy returns.
type Copier interface {
	Name() string
	Copy(ctx context.Context, batch []Desc) error
}

// Transport moves bytes between this peer's memory and another peer's: the
// interface the store's remote fetch uses (fabric/store, remote.go), behind
// which the TCP data plane (transfer/tcp) and the RDMA verbs transport
// (rdma/) plug in, and a fake for tests (transfer/transporttest).
//
// Which transport serves a member is the cluster's choice, made per member
// (fabric/cluster: Route): RDMA when both ends have a usable device and
// exchanged their connection data over the peer service, TCP otherwise. The
// store only sees the Transport and the member's endpoint it is given.
//
// Contract, for every implementation (transporttest.Contract checks it):
//   - Submit executes the batch against the peer at endpoint (an address
//     the transport understands: host:port of the TCP data plane; for RDMA
//     the member whose queue pairs the transport holds) and returns one
//     Completion per descriptor, in the descriptors' order, whatever order
//     they completed in. It returns by ctx's deadline (a transport bounds a
//     context without one by its own default): a descriptor not complete by
//     then fails with an error that wraps context.DeadlineExceeded or
//     context.Canceled. Nothing waits without a deadline.
//   - A descriptor fails alone: a missing remote page is ErrRemoteNotFound
//     for that descriptor, one the transport cannot execute ErrUnsupported,
//     and the others complete. A broken connection fails the descriptors
//     not yet complete.
//   - Completion.Err nil for a Read means Local[LocalOff:LocalOff+Len]
//     holds the bytes of the remote region, written in place (no staging
//     copy), and Header is what the remote side says they are (the holder's
//     page header, checksum included). A transport need not verify the
//     bytes: the caller checks them against Header (page.Header.Verify) and
//     against what it asked for before it uses them, unless the completion
//     says Verified — then the bytes match Header's checksum, and a page
//     that did not fails with a *page.CorruptError instead. The bytes of a
//     descriptor that failed are undefined.
//   - After Submit returns the transport touches no local region of the
//     batch (an RDMA transport waits for, or flushes, its work requests).
//   - Submit is safe for concurrent use.
type Transport interface {
	Name() string
	Submit(ctx context.Context, endpoint string, batch []RemoteDesc) []Completion
}

// Op is what a remote descriptor does.
type Op uint8

const (
	// Read copies the remote region into the local one (RDMA READ; a
	// fetch on the TCP data plane).
	Read Op = iota + 1
	// Write copies the local region into the remote one (RDMA WRITE; not on
	// the TCP data plane, which answers ErrUnsupported).
	Write
)

func (o Op) String() string {
	switch o {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "op?"
}

// RemoteKey names a region of another peer's memory. What identifies it
// depends on how the transport addresses remote memory:
//   - by content (TCP): Page and Layout name a page in the remote peer's
//     store, which resolves it to wherever it keeps the page (a DRAM slot,
//     an SSD slot read for the occasion) and sends its header with it;
//     RemoteOff is 0 and Len the page's size.
//   - by address (RDMA): RKey is the remote memory registration's key (of
//     the remote DRAM pool, exchanged with the queue pair's connection data
//     over the peer service) and Addr the registration's base address;
//     RemoteOff is the page's slot offset in it, which the remote peer gave
//     out with the page's header (Page and Layout still name the page, for
//     the check of the Header).
type RemoteKey struct {
	Page   pagekey.Key
	Layout pagekey.Fingerprint
	RKey   uint32
	Addr   uint64
}

// PageKey names a remote page by content.
func PageKey(k pagekey.Key, layout pagekey.Fingerprint) RemoteKey {
	return RemoteKey{Page: k, Layout: layout}
}

// RemoteDesc is one move between a remote region and a local one: Len
// bytes at RemoteOff of the remote region ⇄ LocalOff of Local.
type RemoteDesc struct {
	Op        Op
	Remote    RemoteKey
	RemoteOff uint64
	Len       uint64
	Local     *Region
	LocalOff  uint64
}

// LocalBytes is the descriptor's local host memory, or nil when it is out
// of range or not host memory.
func (d RemoteDesc) LocalBytes() []byte {
	if d.Local == nil || d.Local.Kind != Host || d.LocalOff > uint64(len(d.Local.Host)) || d.Len > uint64(len(d.Local.Host))-d.LocalOff {
		return nil
	}
	return d.Local.Host[d.LocalOff : d.LocalOff+d.Len : d.LocalOff+d.Len]
}

// Completion is one remote descriptor's outcome.
type Completion struct {
	// Header is what the remote side says the bytes are (a Read that
	// succeeded); the caller verifies the bytes against it.
	Header page.Header
	// Err nil means the descriptor completed (see Transport).
	Err error
	// Verified: the transport checked the bytes against Header itself (the
	// TCP data plane sums each read as it lands), so the caller need not
	// read them again for that; it still checks that Header names what it
	// asked for. A transport that cannot (RDMA: the NIC writes the bytes)
	// leaves it false, and the caller verifies.
	Verified bool
}
