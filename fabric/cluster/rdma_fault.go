package cluster

import (
	"errors"

	ibv "github.com/orbitkv/orbitkv/rdma"
)

// Fault hooks for tests over real verbs: they move QPs into the error
// state behind the engine's back, as a NIC does on a fatal error
// (rdma.Conn.FailQPs), and return how many they moved.

// FailRDMAQPs fails the QPs of the connection this peer dialed to member
// (those its READs of member's pages use); an error when none is up.
func (c *Cluster) FailRDMAQPs(member string) (int, error) {
	conn, err := c.rd.connOf(member)
	if err != nil {
		return 0, err
	}
	return conn.FailQPs()
}

// FailAcceptedRDMAQPs fails the QPs of every connection members dialed
// here (those that answer their READs).
func (c *Cluster) FailAcceptedRDMAQPs() (int, error) {
	c.rd.mu.Lock()
	var conns []*ibv.Conn
	for _, cs := range c.rd.mu.accepted {
		conns = append(conns, cs...)
	}
	c.rd.mu.Unlock()
	n := 0
	var errs []error
	for _, conn := range conns {
		k, err := conn.FailQPs()
		n += k
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}
