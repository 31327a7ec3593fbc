//go:build cgo && linux

package cuda

import "unsafe"

func hostPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
