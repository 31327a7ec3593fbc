//go:build cgo && linux

package rdma

import (
	"testing"

	"github.com/orbitkv/orbitkv/rdma/rdmatest"
)

// TestBindingAgainstStandInLibrary runs the real cgo binding (dlopen,
// dlvsym, the shim's structures, the modify_qp masks, post_send and
// poll_cq through the context's ops table) end to end against
// testdata/standin_ibverbs.c: a stand-in libibverbs compiled here against
// the real <infiniband/verbs.h>, which lays every structure out as
// libibverbs does and refuses what a NIC refuses (wrong state or masks,
// keys, bounds, access). It runs in a child process, because a process
// holds one libibverbs. Needs cc and libibverbs-dev (rdmatest.OverStandIn:
// skips without; ORBITKV_REQUIRE=verbs-headers fails).
func TestBindingAgainstStandInLibrary(t *testing.T) {
	rdmatest.OverStandIn(t, func(t *testing.T) { loopbackScenario(t, Config{GIDIndex: -1}) })
}
