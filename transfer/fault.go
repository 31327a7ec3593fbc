package transfer

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"unsafe"
)

// FaultError reports a copy that touched memory the kernel could no longer
// back: an engine shrank or truncated the shared-memory file behind its
// registered buffer (SIGBUS), so the mapping's tail has nothing under it.
// Engine memory is untrusted; such a fault fails the copy, never the peer.
type FaultError struct {
	Region string // the region the faulting address lies in (an engine buffer's path)
	Offset uint64 // the faulting address's offset in that region
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("memory fault at byte %d of %s: the memory behind it is gone (file shrunk or truncated)", e.Offset, e.Region)
}

// guardFaults makes a memory fault in the calling goroutine panic instead of
// killing the process, for the rest of the calling function; call it as
// defer guardFaults()() before touching host regions, with catchFault
// deferred after it.
func guardFaults() (restore func()) {
	old := debug.SetPanicOnFault(true)
	return func() { debug.SetPanicOnFault(old) }
}

// catchFault, deferred, turns a fault panic at an address inside one of
// batch's host regions into a *FaultError in *err. Any other panic (a fault
// elsewhere is the peer's own bug) goes on.
func catchFault(batch []Desc, err *error) {
	r := recover()
	if r == nil {
		return
	}
	if re, ok := r.(runtime.Error); ok {
		if a, ok := re.(interface{ Addr() uintptr }); ok {
			if fe := regionFault(batch, a.Addr()); fe != nil {
				*err = fe
				return
			}
		}
	}
	panic(r)
}

// regionFault finds the host region of batch that addr lies in.
func regionFault(batch []Desc, addr uintptr) *FaultError {
	in := func(r *Region) *FaultError {
		if r == nil || r.Kind != Host || len(r.Host) == 0 {
			return nil
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(r.Host)))
		if addr < base || addr-base >= uintptr(len(r.Host)) {
			return nil
		}
		return &FaultError{Region: r.Name, Offset: uint64(addr - base)}
	}
	for _, d := range batch {
		if fe := in(d.Src); fe != nil {
			return fe
		}
		if fe := in(d.Dst); fe != nil {
			return fe
		}
	}
	return nil
}
