package tcp

import (
	"testing"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/transfer"
	"github.com/orbitkv/orbitkv/transfer/transporttest"
)

// tcpHarness is a Client against a real Server on loopback, serving from
// a memSource.
func tcpHarness(t *testing.T) transporttest.Harness {
	src := newMemSource()
	_, addr := serve(t, src, nil)
	c := NewClient(nil)
	t.Cleanup(func() { c.Close() })
	put := func(h page.Header, data []byte) transfer.RemoteKey {
		src.mu.Lock()
		defer src.mu.Unlock()
		src.pages[h.Key] = Page{Header: h, Data: append([]byte(nil), data...)}
		return transfer.PageKey(h.Key, h.Layout)
	}
	stall := func() {
		hold := make(chan struct{}) // the answer waits for the case's end: its fetch ends by its own deadline
		t.Cleanup(func() { close(hold) })
		src.mu.Lock()
		src.block, src.hold = make(chan struct{}), hold
		src.mu.Unlock()
	}
	return transporttest.Harness{Transport: c, Endpoint: addr, Put: put, Stall: stall}
}

// TestTransportContract: the TCP data plane passes the transfer.Transport
// contract, and so does the fake in pass-through mode over it.
func TestTransportContract(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { transporttest.Contract(t, tcpHarness) })
	t.Run("faulty pass-through over tcp", func(t *testing.T) {
		transporttest.Contract(t, func(t *testing.T) transporttest.Harness {
			h := tcpHarness(t)
			h.Transport = &transporttest.Faulty{Inner: h.Transport}
			return h
		})
	})
}
