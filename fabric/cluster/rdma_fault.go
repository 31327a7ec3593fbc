package cluster

// FailRDMAQPs moves the QPs of this peer's RDMA connection to member into
// the error state, as a NIC does on a fatal error (rdma.Conn.FailQPs): a
// fault hook for tests over real verbs. It returns how many it moved, and
// an error when no connection to member is up.
func (c *Cluster) FailRDMAQPs(member string) (int, error) {
	conn, err := c.rd.connOf(member)
	if err != nil {
		return 0, err
	}
	return conn.FailQPs()
}
