// Package transfer is `orbitkv bench transfer` (Config, Run) and `orbitkv
// bench fabric` (FabricConfig, RunFabric): page moves over the data planes
// beside their baselines in the same run.
//
// bench transfer measures a matrix of transports (TCP, RDMA), operations,
// page sizes and connections between a --serve side and a --client side
// (two network namespaces with --netns), each cell beside the best of
// several iperf3 variants (baseline.go), with the CPU both sides used
// (cpu.go, cpus.go), plain TCP streams into the same memory (stream.go) and
// the client's memory copy rate (mem.go). bench fabric fetches pages from
// one DRAM pool into another over the TCP data plane, beside iperf3 on the
// same link (fabric.go, RunFabric).
//
// It drives the transfer packages' own client and server (transfer/tcp,
// rdma) and a DRAM pool (tiers/dram) directly, not a peer: what it measures
// is the data plane itself, below fabric's public API, so that the peer's
// catalog and placement are not in the figures.
package transfer
