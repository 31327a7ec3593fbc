package lint

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestCgoBuildIsQuiet: with the C flags the Makefile builds with, neither
// our cgo package nor go-nvml's (whose wrappers call functions NVML 13
// deprecated) prints a compiler warning, so `make test` output carries
// none. Go does not replay a cached build's C warnings, so each package
// is compiled afresh: a -trimpath prefix no file has (a new one each run)
// changes its build key and nothing else.
func TestCgoBuildIsQuiet(t *testing.T) {
	out, err := exec.Command("make", "-s", "--no-print-directory", "-C", "../..", "print-cgo-cflags").Output()
	if err != nil {
		t.Fatalf("make print-cgo-cflags: %v", err)
	}
	flags := strings.TrimSpace(string(out))
	for _, p := range []string{module + "/cuda", "github.com/NVIDIA/go-nvml/pkg/nvml"} {
		nonce := fmt.Sprintf("-gcflags=%s=-trimpath=/nonexistent-%d", p, time.Now().UnixNano())
		cmd := exec.Command("go", "build", nonce, p)
		cmd.Env = append(os.Environ(), "CGO_CFLAGS="+flags)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", p, err, b)
		}
		if strings.Contains(string(b), "warning:") {
			t.Errorf("building %s with CGO_CFLAGS=%q warns:\n%.2000s", p, flags, b)
		}
	}
}
