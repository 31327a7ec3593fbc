package cuda

import (
	"errors"
	"fmt"
)

// ErrNotSupported is returned by every entry point of a build without cgo
// (CGO_ENABLED=0) or off Linux, and by features the loaded driver lacks.
var ErrNotSupported = errors.New("cuda: not supported in this build")

// ErrNoDriver reports that libcuda.so.1 could not be loaded or initialised.
var ErrNoDriver = errors.New("cuda: no usable driver")

// ErrClosed reports use of a Device, Copier or other handle after Close.
var ErrClosed = errors.New("cuda: use of closed handle")

// Error is a failed driver call: the operation, the CUresult and its name.
type Error struct {
	Op   string // what was being done, e.g. "cuMemAlloc 1048576 bytes"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Msg  string // the driver's description
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Op, e.Name, e.Code, e.Msg)
}

// Is lets errors.Is(err, ErrNotSupported) match CUDA_ERROR_NOT_SUPPORTED.
func (e *Error) Is(target error) bool {
	return target == ErrNotSupported && e.Code == codeNotSupported
}

const (
	codeNotReady     = 600
	codeNotSupported = 801
)
