package cluster

// How far the catalog's dissemination has come: what a benchmark (bench
// cluster --scale) and tests wait on, without reading the index itself.

// Sequence is the number of this peer's last catalog change (its
// announcements are numbered 1..Sequence).
func (c *Cluster) Sequence() uint64 { return c.currentSeq() }

// Applied returns the last of member's announcements this peer's index
// holds; false when member is not tracked or its index here is not
// complete (no snapshot of its current life yet, or a hole since).
func (c *Cluster) Applied(member string) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.origins[member]
	if o == nil || o.state != stateAlive || !o.current || !o.synced {
		return 0, false
	}
	return o.applied, true
}
