// Package rdmatest runs tests over rdma's STAND-IN libibverbs
// (rdma/testdata/standin_ibverbs.c): a library compiled at test time
// against the real <infiniband/verbs.h> that lays every structure out as
// libibverbs does, refuses what a NIC refuses and copies with memcpy
// between registered ranges. NOT HARDWARE: its rates mean nothing, and a
// test passing over it says the code above the verbs calls is right, not
// that a NIC agrees (docs/rdma.md).
package rdmatest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// childEnv marks the child process OverStandIn starts.
const childEnv = "ORBITKV_RDMA_STANDIN"

// OverStandIn runs child over the stand-in library: it builds the library
// with cc, then runs the calling test again in a child process of the test
// binary (a process holds one libibverbs) whose rdma.Open loads it, and
// there calls child. The parent fails unless the child passed, and logs the
// child's output. Without cc or libibverbs-dev's header the test skips,
// saying so, or fails under ORBITKV_REQUIRE=verbs-headers. Call it from a
// top-level test, first thing.
func OverStandIn(t *testing.T, child func(t *testing.T)) {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		child(t)
		return
	}
	lib := Build(t)
	name := t.Name()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1", "ORBITKV_LIBIBVERBS="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("child over the stand-in: %v\n%s", err, out)
	}
	t.Logf("child over the stand-in (not hardware):\n%s", out)
}

// Build compiles the stand-in into a temporary directory and returns its
// path (Compiler: it skips, or fails, without cc or the header).
func Build(t *testing.T) string {
	t.Helper()
	cc := Compiler(t, "stand-in not built")
	lib := filepath.Join(t.TempDir(), "libibverbs-standin.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, source(t)).CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in: %v\n%s", err, out)
	}
	return lib
}

// Compiler returns the C compiler's path when it and libibverbs-dev's
// <infiniband/verbs.h> are there; otherwise the test skips, saying what is
// missing and what is not done (skipped), or fails under
// ORBITKV_REQUIRE=verbs-headers.
func Compiler(t *testing.T, skipped string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if _, herr := os.Stat("/usr/include/infiniband/verbs.h"); err != nil || herr != nil {
		if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "verbs-headers") {
			t.Fatalf("ORBITKV_REQUIRE=verbs-headers but no cc (%v) or verbs.h (%v)", err, herr)
		}
		t.Skip("no C compiler or /usr/include/infiniband/verbs.h (libibverbs-dev): " + skipped)
	}
	return cc
}

// source is the stand-in's C file, beside this package in the source tree.
func source(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("rdmatest: no source path for the stand-in")
	}
	return filepath.Join(filepath.Dir(file), "..", "testdata", "standin_ibverbs.c")
}
