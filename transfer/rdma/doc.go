// Package rdma adapts the RDMA engine (package github.com/orbitkv/orbitkv/rdma,
// imported here as ibv) to the transfer layer: Transport implements
// transfer.Transport over a member's ibv.Conn, one Completion per
// descriptor. The mapping:
//
//	transfer.RemoteDesc            ibv (rdma package)
//	-------------------            ------------------
//	Op Read / Write            →   Conn.Read / Conn.Write (one batch each)
//	Read's remote key          →   Locator.Locate → Placement: the region key
//	                               of the member's ConnInfo (Op.Remote), the
//	                               page's offset in it (Op.RemoteOff) and its
//	                               header (Completion.Header)
//	Write's Remote.RKey        →   Op.Remote (by address only; a Write by
//	                               content is ErrUnsupported)
//	Len                        →   the Op's one local Segment's length
//	Local + LocalOff           →   Op.Local = [{Registry.Lookup(Local), LocalOff, Len}]
//	per-descriptor result      →   the []error Conn.Read/Write returns, same order
//	deadline from ctx          →   ctx passed through (ibv Config.Timeout if none)
//	transport name             →   "rdma"
//
// Which members are reached this way is fabric/cluster's choice (Route):
// RDMA when both ends opened a device (ibv.Open did not return
// ErrNoDevice) and the ConnInfo exchange over the mutual-TLS peer service
// succeeded; TCP otherwise, and after ErrLaneDown.
//
// Local regions must be registered with the engine (Engine.RegisterHost for
// the DRAM pool's slabs, Engine.RegisterDevice for engine HBM through
// dmabuf) and recorded in the Registry; a descriptor on any other region
// fails alone with ErrUnregistered.
//
// What ran where: TestContractOverStandIn runs transfer's contract suite
// through the real cgo binding against rdma's stand-in libibverbs (a
// memcpy model, NOT HARDWARE); nothing here has run on an RDMA NIC.
package rdma
