package transfer

import "github.com/orbitkv/orbitkv/internal/page"

// Placed is where a peer holds a page in its DRAM region (the region its
// RDMA engine registered for members' READs): the page's byte offset in
// that region and its header. OK false: the page is not in DRAM (only on
// SSD, or not held as asked), and the rest is unset.
type Placed struct {
	OK     bool
	Off    uint64
	Header page.Header
}
