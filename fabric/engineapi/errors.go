package engineapi

import (
	"context"
	"errors"
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/store"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/tiers/hbm"
	"github.com/orbitkv/orbitkv/transfer"
)

// codeTable maps the peer's sentinel errors to gRPC codes; the first match
// wins. Everything else is Internal.
var codeTable = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalid, codes.InvalidArgument},
	{pagekey.ErrKeySize, codes.InvalidArgument},
	{transfer.ErrGeometry, codes.InvalidArgument},
	{hbm.ErrBuffer, codes.FailedPrecondition},
	{errUnknownSession, codes.NotFound},
	{store.ErrNotFound, codes.NotFound},
	{errLayoutMismatch, codes.FailedPrecondition},
	{errClosing, codes.Unavailable},
	{errTooManyOps, codes.ResourceExhausted},
	// RDMA, where its errors surface (a remote fetch over a lane):
	{rdma.ErrBadConnInfo, codes.InvalidArgument},
	{rdma.ErrLaneDown, codes.Unavailable},
	{rdma.ErrClosed, codes.Unavailable},
	{rdma.ErrNoDevice, codes.FailedPrecondition},
	{rdma.ErrNotSupported, codes.FailedPrecondition},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
	{rdma.ErrTimeout, codes.DeadlineExceeded}, // after the context rows: it wraps the cause
}

// wrapNotFound is store.ErrNotFound with a message: an unknown lease or
// operation.
func wrapNotFound(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{store.ErrNotFound}, args...)...)
}

// errLayoutMismatch reports a request whose layout differs from its session's.
var errLayoutMismatch = errors.New("layout mismatch")

// toStatus converts an error to a gRPC status error.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range codeTable {
		if errors.Is(err, c.err) {
			return status.Error(c.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}
