package rdma

import "fmt"

// FailQPs moves every lane's QP to the error state behind the engine's
// back, as a NIC does on a fatal error: the engine learns it from the
// flushed completions of its next batch (the lane is then broken, its
// slices go to a lane still up or fail with ErrLaneDown) and recovers as
// after any error completion. It returns how many QPs it moved. A fault
// hook for tests over real verbs (docs/rdma.md); it waits for a batch in
// flight.
func (c *Conn) FailQPs() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	n := 0
	for _, l := range c.lanes {
		if l.qp == 0 {
			continue
		}
		if err := c.e.v.modifyQP(l.qp, qpAttr{State: QPErr}); err != nil {
			return n, fmt.Errorf("rdma: QP %#x on %s to ERR: %w", l.qpn, l.nic.info.Name, err)
		}
		n++
	}
	return n, nil
}
