package engineapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/rdma"
)

// TestRDMAErrorCodes: the rdma sentinels reach the engine API's clients as
// codes they can act on (retry, recompute, fix the configuration), not
// Internal, however deep they are wrapped.
func TestRDMAErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{rdma.ErrLaneDown, codes.Unavailable},
		{rdma.ErrClosed, codes.Unavailable},
		{rdma.ErrBadConnInfo, codes.InvalidArgument},
		{rdma.ErrNoDevice, codes.FailedPrecondition},
		{rdma.ErrNoLibrary, codes.FailedPrecondition},
		{rdma.ErrDisabled, codes.FailedPrecondition},
		{rdma.ErrNotSupported, codes.FailedPrecondition},
		{fmt.Errorf("%w: %w", rdma.ErrTimeout, context.DeadlineExceeded), codes.DeadlineExceeded},
		{fmt.Errorf("%w: %w", rdma.ErrTimeout, context.Canceled), codes.Canceled},
		{rdma.ErrTimeout, codes.DeadlineExceeded},
		{errors.New("other"), codes.Internal},
	} {
		err := toStatus(fmt.Errorf("fetch page: %w", tc.err))
		if got := status.Code(err); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
}
