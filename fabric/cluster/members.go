package cluster

import (
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

// What the rest of the peer asks of the cluster: the store's remote fetch
// (its Members interface), the engine API's lookups and Peers.

// Name is this member's name.
func (c *Cluster) Name() string { return c.name }

// GossipAddr is the address members reach this peer's gossip at; "" before
// Start.
func (c *Cluster) GossipAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gossipAddr
}

// Remote returns what members announced of k.
func (c *Cluster) Remote(k pagekey.Key) (catalog.RemotePage, bool) { return c.remote.Get(k) }

// Forget drops origin from k's holders: it no longer has the page, or sent
// it corrupt, so lookups stop offering it from there.
func (c *Cluster) Forget(origin int, k pagekey.Key) { c.remote.Remove(origin, k) }

// Extend returns how many leading keys live members hold with the layout
// and size, for a lookup that found the keys before them here.
func (c *Cluster) Extend(keys []pagekey.Key, layout pagekey.Fingerprint, size uint64) int {
	return len(c.remote.Extend(keys, layout, size, c.Usable))
}

// Route returns the transport that reaches origin and its endpoint there,
// if origin is alive: RDMA when both ends have a usable device and the
// connection exchange succeeded (transport.go; what RDMA cannot carry, and
// everything after its lane goes down, moves over TCP), else the TCP data
// plane; the endpoint is the member's data address.
func (c *Cluster) Route(id int) (transfer.Transport, string, bool) {
	c.mu.Lock()
	o := c.aliveLocked(id)
	var name, addr string
	var hasDevice bool
	if o != nil {
		name, addr, hasDevice = o.name, o.dataAddr, o.rdma
	}
	c.mu.Unlock()
	if o == nil {
		return nil, "", false
	}
	if c.rd.choice(name, hasDevice).transport != transportRDMA {
		return c.data, addr, true
	}
	return &fallback{member: name, rdma: &placing{member: name, from: c.name, tr: c.rd.tr, client: c.peerClient, log: c.log}, tcp: c.data, down: func(err error) { c.rd.laneDown(name, err) },
		tcpPages: c.rd.tcpPages}, addr, true
}

// NoteFetch counts a page fetched for a load, by result (ok, missing,
// corrupt, failed), and the bytes of one that arrived verified.
func (c *Cluster) NoteFetch(result string, bytes uint64) {
	c.m.fetchPages.WithLabelValues(result).Inc()
	if bytes > 0 {
		c.m.fetchBytes.Add(float64(bytes))
	}
}

// RDMAStats are the RDMA engine's counters; false without an engine.
func (c *Cluster) RDMAStats() (ibv.Stats, bool) {
	if c.rd.eng == nil {
		return ibv.Stats{}, false
	}
	return c.rd.eng.Stats(), true
}

// RegisterDevice registers engine HBM with the RDMA engine for GPUDirect:
// region (a transfer.Device region, an engine buffer the peer imported)
// through export, a dmabuf of that memory (cuda.Device.ExportDmabuf), as a
// destination of this peer's own READs only (rdma.LocalOnly: never offered
// to members), recorded with the RDMA transport so that descriptors may
// name it. Without an engine the error wraps rdma.ErrNoDevice. release
// forgets and deregisters it; it is idempotent and runs before the memory
// is unmapped.
func (c *Cluster) RegisterDevice(region *transfer.Region, export ibv.DmabufExporter) (release func() error, err error) {
	e := c.rd.live.Load()
	if e == nil {
		return nil, fmt.Errorf("register %s: %w", region.Name, ibv.ErrNoDevice)
	}
	mr, err := e.RegisterDevice(region.Name, region.Device, region.Size, ibv.LocalOnly, export)
	if err != nil {
		return nil, err
	}
	c.rd.regs.Add(region, mr)
	var once sync.Once
	var derr error
	return func() error {
		once.Do(func() {
			c.rd.regs.Remove(region)
			derr = mr.Deregister()
		})
		return derr
	}, nil
}
