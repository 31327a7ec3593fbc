package transfer

import (
	"context"
	"errors"
)

// ErrUnsupported reports a descriptor a transport cannot execute (e.g. device
// memory on the local transport).
var ErrUnsupported = errors.New("transport does not support this memory")

// Transport executes descriptor batches. Copy returns when every descriptor
// is done or the context ends; a Transport must not touch the regions after
// Copy returns.
type Transport interface {
	Name() string
	Copy(ctx context.Context, batch []Desc) error
}
