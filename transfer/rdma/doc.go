// Package rdma adapts the RDMA engine (package github.com/orbitkv/orbitkv/rdma,
// imported here as ibv) to the transfer layer: descriptors that name a
// remote region by key, an offset and a length, and a local region and
// offset, become ibv.Ops on a member's ibv.Conn, with one result per
// descriptor.
//
// # TODO(lead): implement transfer.Transport once the batched interface lands
//
// When this adapter was written (branch rdma, 2026-12-01) transfer.Transport
// was still `Copy(ctx, []Desc) error` with local Src/Dst regions, and its
// batched remote-descriptor form (READ/WRITE, remote region key + offset +
// length → local region + offset, per-descriptor results, deadline from
// ctx) was being written on another branch. Desc below mirrors that shape;
// when it lands, replace Desc with the transfer package's descriptor type
// and make Transport satisfy the interface. The mapping is:
//
//	transfer descriptor            ibv (rdma package)
//	-------------------            ------------------
//	op READ / WRITE            →   Conn.Read / Conn.Write (one batch)
//	remote region key          →   Op.Remote (RemoteRegion.Key from the peer's ConnInfo)
//	remote offset              →   Op.RemoteOff
//	length                     →   sum of Op.Local lengths
//	local region + offset      →   Op.Local = [{Resolve(region), offset, length}]
//	                               (several local pieces of one descriptor, e.g.
//	                               a page scattered over layer × plane blocks,
//	                               become several Segments of one Op: one READ
//	                               work request with a scatter list)
//	per-descriptor result      →   the []error Conn.Read/Write returns, same order
//	deadline from ctx          →   ctx passed through (Config.Timeout if none)
//	transport name             →   "rdma"
//	member choice              →   Members/cluster: RDMA when both ends opened a
//	                               device (ibv.Open did not return ErrNoDevice)
//	                               and the peer's ConnInfo arrived over the
//	                               mutual-TLS peer gRPC service (ConnInfo.Marshal
//	                               bytes); TCP otherwise, and after ErrLaneDown
//
// Local regions must be registered with the engine (Engine.RegisterHost for
// the DRAM pool's slabs, Engine.RegisterDevice for engine HBM through
// dmabuf); Resolve maps the transfer layer's region to that registration.
package rdma
