package cuda

import (
	"fmt"
	"os"
)

// CheckDmabufRange checks a range for ExportDmabuf: non-empty, not past the
// end of the address space, and start and length multiples of the host
// page size (what cuMemGetHandleForAddressRange and ibv_reg_dmabuf_mr ask).
func CheckDmabufRange(p DevicePtr, size uint64) error {
	page := uint64(os.Getpagesize())
	switch {
	case size == 0:
		return fmt.Errorf("cuda: dmabuf of 0 bytes at %#x", uint64(p))
	case uint64(p)+size < uint64(p):
		return fmt.Errorf("cuda: dmabuf of %d bytes at %#x: past the end of the address space", size, uint64(p))
	case uint64(p)%page != 0 || size%page != 0:
		return fmt.Errorf("cuda: dmabuf of %d bytes at %#x: start and length must be multiples of the host page (%d bytes)", size, uint64(p), page)
	}
	return nil
}
