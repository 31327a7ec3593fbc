package cuda

import (
	_ "embed"
	"os"
)

// copyPTX is the gather/scatter kernel, generated from kernels/copy.cu by
// nvcc 13.0 on the GPU machine. nvcc 13 stamps PTX ISA 9.0, which only CUDA
// 13 drivers accept; the kernel uses nothing newer than ISA 7.8 (the first
// with sm_90), so the stamp is lowered to 7.8 and CUDA 11.8+ drivers load it.
// Where a driver cannot, MethodAuto falls back to the copy engines.
//
//go:generate sh -c "nvcc -ptx -arch=compute_90 -O3 -o kernels/copy.ptx kernels/copy.cu && sed -i 's/^\\.version .*/.version 7.8/' kernels/copy.ptx"
//go:embed kernels/copy.ptx
var copyPTX string

// copyKernelName is the kernel's entry point in copyPTX.
const copyKernelName = "orbitkv_copy_segments"

// kernelPTX returns the PTX to load: the embedded module, or the file named
// by ORBITKV_CUDA_PTX (to try a rebuilt kernel without rebuilding Go).
func kernelPTX() (string, error) {
	if p := os.Getenv("ORBITKV_CUDA_PTX"); p != "" {
		b, err := os.ReadFile(p)
		return string(b), err
	}
	return copyPTX, nil
}
