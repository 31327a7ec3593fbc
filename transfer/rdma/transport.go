package rdma

import (
	"context"
	"errors"
	"fmt"

	ibv "github.com/orbitkv/orbitkv/rdma"
)

// Op is READ (remote → local) or WRITE (local → remote).
type Op uint8

const (
	Read Op = iota
	Write
)

// Desc is one remote transfer: Len bytes at RemoteOff in the peer's region
// RemoteKey, to or from Local at LocalOff. It mirrors the batched
// transfer.Transport descriptor (see the TODO in doc.go).
type Desc struct {
	RemoteKey uint32
	RemoteOff uint64
	Len       uint64
	Local     any // the transfer layer's local region; Resolve maps it
	LocalOff  uint64
}

// ErrUnregistered reports a descriptor whose local region the engine has
// not registered.
var ErrUnregistered = errors.New("rdma transport: local region not registered")

// Transport runs descriptor batches on one member's connection.
type Transport struct {
	Conn *ibv.Conn
	// Resolve maps a descriptor's local region to its registration.
	Resolve func(local any) (*ibv.Region, bool)
}

// Name is the transport's name in metrics and `orbitkv peers`.
func (t *Transport) Name() string { return "rdma" }

// Do runs one batch and returns one error per descriptor.
func (t *Transport) Do(ctx context.Context, op Op, batch []Desc) []error {
	ops, errs := toOps(batch, t.Resolve)
	idx := make([]int, 0, len(batch))
	run := make([]ibv.Op, 0, len(batch))
	for i, err := range errs {
		if err == nil {
			idx, run = append(idx, i), append(run, ops[i])
		}
	}
	if len(run) == 0 {
		return errs
	}
	var res []error
	if op == Read {
		res = t.Conn.Read(ctx, run)
	} else {
		res = t.Conn.Write(ctx, run)
	}
	for k, i := range idx {
		errs[i] = res[k]
	}
	return errs
}

// toOps maps descriptors to ibv.Ops; a descriptor that cannot be mapped
// gets its error and a zero Op. Pure.
func toOps(batch []Desc, resolve func(any) (*ibv.Region, bool)) ([]ibv.Op, []error) {
	ops, errs := make([]ibv.Op, len(batch)), make([]error, len(batch))
	for i, d := range batch {
		r, ok := resolve(d.Local)
		switch {
		case !ok:
			errs[i] = fmt.Errorf("descriptor %d: %w", i, ErrUnregistered)
		case d.Len == 0:
			errs[i] = fmt.Errorf("descriptor %d: empty", i)
		default:
			ops[i] = ibv.Op{Remote: d.RemoteKey, RemoteOff: d.RemoteOff, Local: []ibv.Segment{{Region: r, Off: d.LocalOff, Len: d.Len}}}
		}
	}
	return ops, errs
}
