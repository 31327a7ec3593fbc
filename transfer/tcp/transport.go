package tcp

import (
	"context"
	"fmt"

	"github.com/orbitkv/orbitkv/transfer"
)

// The TCP data plane as a transfer.Transport: a batch of Read descriptors
// naming remote pages by content (transfer.PageKey; RemoteOff 0, Len the
// page's size) into host memory is one Fetch request to the endpoint,
// each page read from the socket straight into its local region (no
// staging copy), and summed read by read, as it lands or on a goroutine
// behind the reads (receive.go, Client.Verify): a page
// whose bytes do not match its header fails with a *page.CorruptError, and
// the others complete Verified, so the store does not read them again.

var _ transfer.Transport = (*Client)(nil)

// Name implements transfer.Transport.
func (c *Client) Name() string { return "tcp" }

// Submit implements transfer.Transport. A Write, a remote region named by
// address (RKey), a non-zero RemoteOff or a local region that is not host
// memory fails its descriptor with transfer.ErrUnsupported; the others go
// out as one request.
func (c *Client) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	out := make([]transfer.Completion, len(batch))
	wants := make([]Want, 0, len(batch))
	dst := make([][]byte, 0, len(batch))
	at := make([]int, 0, len(batch)) // batch index of each want
	for i, d := range batch {
		if err := checkDesc(d); err != nil {
			out[i].Err = err
			continue
		}
		wants = append(wants, Want{Key: d.Remote.Page, Layout: d.Remote.Layout, Size: d.Len})
		dst = append(dst, d.LocalBytes())
		at = append(at, i)
	}
	for lo := 0; lo < len(wants); lo += MaxPages {
		hi := min(lo+MaxPages, len(wants))
		for j, r := range c.Fetch(ctx, endpoint, wants[lo:hi], dst[lo:hi]) {
			out[at[lo+j]] = transfer.Completion{Header: r.Header, Err: r.Err, Verified: r.Err == nil}
		}
	}
	return out
}

func checkDesc(d transfer.RemoteDesc) error {
	switch {
	case d.Op != transfer.Read:
		return fmt.Errorf("%w: %s on the tcp data plane (fetches only)", transfer.ErrUnsupported, d.Op)
	case d.Remote.RKey != 0 || d.Remote.Addr != 0 || d.RemoteOff != 0:
		return fmt.Errorf("%w: a remote region by address on the tcp data plane (pages by key only)", transfer.ErrUnsupported)
	case d.LocalBytes() == nil:
		return fmt.Errorf("%w: local region %v at %d+%d is not host memory in range", transfer.ErrUnsupported, regionName(d.Local), d.LocalOff, d.Len)
	}
	return nil
}

func regionName(r *transfer.Region) string {
	if r == nil {
		return "<nil>"
	}
	return r.Name
}
