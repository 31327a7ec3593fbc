// Package rdmatest runs tests over rdma's STAND-IN libibverbs
// (rdma/testdata/standin_ibverbs.c): a library compiled at test time
// against the real <infiniband/verbs.h> that lays every structure out as
// libibverbs does, refuses what a NIC refuses and copies with memcpy
// between registered ranges. NOT HARDWARE: its rates mean nothing, and a
// test passing over it says the code above the verbs calls is right, not
// that a NIC agrees (docs/rdma.md). With -rdmatest.library=system the same
// scenarios run over the real libibverbs and its devices instead (make
// test-rdma runs them so on Soft-RoCE).
package rdmatest

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// library is the explicit switch between the stand-in and the real
// libibverbs (docs/rdma.md): "" (the default) builds the stand-in and runs
// each scenario in a child over it; "standin" is that child (the parent
// passes it, with ORBITKV_LIBIBVERBS naming the library it built);
// "system" runs each scenario in this process over the system's
// libibverbs and its devices (the Soft-RoCE guests of make test-rdma).
var library = flag.String("rdmatest.library", "",
	`run the stand-in scenarios over "system" (the real libibverbs and its devices, in this process); "standin" marks the child the default starts`)

// OverStandIn runs child over the stand-in library: it builds the library
// with cc, then runs the calling test again in a child process of the test
// binary (a process holds one libibverbs) whose rdma.Open loads it, and
// there calls child. The parent fails unless the child passed, and logs the
// child's output. Without cc or libibverbs-dev's header the test skips,
// saying so, or fails under ORBITKV_REQUIRE=verbs-headers. With
// -rdmatest.library=system it calls child in this process over the real
// libibverbs instead. Call it from a top-level test, first thing.
func OverStandIn(t *testing.T, child func(t *testing.T)) {
	t.Helper()
	lib := os.Getenv("ORBITKV_LIBIBVERBS")
	switch *library {
	case "system":
		if lib != "" {
			t.Fatalf("-rdmatest.library=system, but ORBITKV_LIBIBVERBS names %s", lib)
		}
		t.Log("over the system's libibverbs and its devices (-rdmatest.library=system)")
		child(t)
		return
	case "standin":
		if lib == "" {
			t.Fatal("-rdmatest.library=standin (the stand-in's child) without ORBITKV_LIBIBVERBS")
		}
		child(t)
		return
	case "":
	default:
		t.Fatalf("-rdmatest.library=%q: want system, standin or nothing", *library)
	}
	lib = Build(t)
	name := t.Name()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1", "-rdmatest.library=standin")
	cmd.Env = append(os.Environ(), "ORBITKV_LIBIBVERBS="+lib)
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
