package cluster

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

// The choice of data plane per member. RDMA when both ends have a usable
// device and the ConnInfo exchange over the peer service succeeded; TCP
// otherwise, and after the member's RDMA lane went down (a fallback, counted
// in orbitkv_cluster_transport_fallbacks_total) until a fresh connection is
// dialed (rdmaRetryAfter later, then as a failed exchange is retried). `orbitkv peers` and
// orbitkv_cluster_member_transport show the choice and why.

// Transport names, as peers and metrics show them.
const (
	transportTCP  = "tcp"
	transportRDMA = "rdma"
)

// linkState is where this peer's RDMA connection to one member stands.
type linkState uint8

const (
	linkNone   linkState = iota // not tried yet
	linkUp                      // dialed and connected: RDMA is used
	linkFailed                  // the exchange or connect failed: retried later
	linkDown                    // the lane went down after use: TCP until redialed
)

// choice is one member's data plane and, for TCP, why.
type choice struct {
	transport, why string
}

// chooseTransport is the decision, pure: local is this peer's RDMA status
// ("" = a usable device, else why not), memberRDMA whether the member
// advertised a device, and state/lastErr its link's.
func chooseTransport(local string, memberRDMA bool, state linkState, lastErr string) choice {
	switch {
	case local != "":
		return choice{transportTCP, local}
	case !memberRDMA:
		return choice{transportTCP, "member has no device"}
	case state == linkUp:
		return choice{transportRDMA, ""}
	case state == linkDown:
		return choice{transportTCP, "rdma lane down"}
	case state == linkFailed:
		return choice{transportTCP, "rdma exchange failed: " + lastErr}
	}
	return choice{transportTCP, "rdma connecting"}
}

// fallback is a member's route when RDMA is chosen: descriptors go to the
// RDMA transport; those it cannot carry (ErrUnsupported: no placement, an
// unregistered region), those failed because the lane is down and pages
// READ whose bytes fail their placement's checksum (verified here: the
// holder may have changed the slot under the READ) go to the TCP data
// plane, and a lane down is reported to down once per Submit. A page
// corrupt in the holder's DRAM fails over TCP too, as corrupt.
type fallback struct {
	member string // the RDMA endpoint
	rdma   transfer.Transport
	tcp    transfer.Transport
	down   func(err error)
	// tcpPages counts the descriptors carried over TCP (nil: not counted).
	tcpPages prometheus.Counter
}

func (f *fallback) Name() string { return transportRDMA }

// Submit runs batch over RDMA and retries over TCP (at endpoint, the
// member's data address) what RDMA could not do.
func (f *fallback) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	out := f.rdma.Submit(ctx, f.member, batch)
	var idx []int
	var again []transfer.RemoteDesc
	var downErr error
	for i, c := range out {
		laneDown := errors.Is(c.Err, ibv.ErrLaneDown) || errors.Is(c.Err, ibv.ErrClosed)
		if laneDown && downErr == nil {
			downErr = c.Err
		}
		if laneDown || errors.Is(c.Err, transfer.ErrUnsupported) || !readVerified(batch[i], &out[i]) {
			idx, again = append(idx, i), append(again, batch[i])
		}
	}
	if downErr != nil {
		f.down(downErr)
	}
	if len(again) == 0 || ctx.Err() != nil {
		return out
	}
	if f.tcpPages != nil {
		f.tcpPages.Add(float64(len(again)))
	}
	for k, c := range f.tcp.Submit(ctx, endpoint, again) {
		out[idx[k]] = c
	}
	return out
}

// readVerified checks a READ that completed against its header's checksum
// (marking it Verified) and says false when the bytes fail it. Anything
// else (a failure, a header that names another page: the store's checks)
// is left as it is.
func readVerified(d transfer.RemoteDesc, c *transfer.Completion) bool {
	if c.Err != nil || c.Verified || d.Op != transfer.Read || c.Header.Key != d.Remote.Page || c.Header.Layout != d.Remote.Layout || c.Header.Length != d.Len {
		return true
	}
	if c.Header.Verify(d.LocalBytes()) != nil {
		return false
	}
	c.Verified = true
	return true
}
