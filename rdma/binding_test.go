//go:build cgo && linux

package rdma

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBindingAgainstStandInLibrary runs the real cgo binding (dlopen,
// dlvsym, the shim's structures, the modify_qp masks, post_send and
// poll_cq through the context's ops table) end to end against
// testdata/standin_ibverbs.c: a stand-in libibverbs compiled here against
// the real <infiniband/verbs.h>, which lays every structure out as
// libibverbs does and refuses what a NIC refuses (wrong state or masks,
// keys, bounds, access). It runs in a child process, because a process
// holds one libibverbs. Needs cc and libibverbs-dev (skips without).
func TestBindingAgainstStandInLibrary(t *testing.T) {
	if os.Getenv("ORBITKV_RDMA_STANDIN") != "" { // the child
		loopbackScenario(t, Config{GIDIndex: -1})
		return
	}
	cc, err := exec.LookPath("cc")
	if _, herr := os.Stat("/usr/include/infiniband/verbs.h"); err != nil || herr != nil {
		if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "verbs-headers") {
			t.Fatalf("ORBITKV_REQUIRE=verbs-headers but no cc (%v) or verbs.h (%v)", err, herr)
		}
		t.Skip("no C compiler or /usr/include/infiniband/verbs.h (libibverbs-dev): stand-in not built")
	}
	lib := filepath.Join(t.TempDir(), "libibverbs-standin.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, "testdata/standin_ibverbs.c").CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in: %v\n%s", err, out)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBindingAgainstStandInLibrary$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "ORBITKV_RDMA_STANDIN=1", "ORBITKV_LIBIBVERBS="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestBindingAgainstStandInLibrary") {
		t.Fatalf("child over the stand-in: %v\n%s", err, out)
	}
	t.Logf("child over the stand-in:\n%s", out)
}
