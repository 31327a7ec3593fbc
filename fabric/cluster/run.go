package cluster

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/crc32c"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/internal/pki"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// clusterMetrics are the fabric's cluster series.
type clusterMetrics struct {
	members                         prometheus.Gauge
	announced, received, sendErrors prometheus.Counter
	badMessages                     prometheus.Counter
	rejected                        *prometheus.CounterVec
	syncs                           *prometheus.CounterVec
	fetchPages                      *prometheus.CounterVec
	fetchBytes                      prometheus.Counter
	claims                          *prometheus.CounterVec // compact catalog: confirmations of filter claims, by result
}

func newClusterMetrics(reg *prometheus.Registry, remote *index) *clusterMetrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "orbitkv", Subsystem: "cluster", Name: name, Help: help}
	}
	m := &clusterMetrics{
		members:     prometheus.NewGauge(prometheus.GaugeOpts(opts("members", "Live members of the cluster, this peer included."))),
		announced:   prometheus.NewCounter(prometheus.CounterOpts(opts("announced_total", "Catalog changes this peer announced."))),
		received:    prometheus.NewCounter(prometheus.CounterOpts(opts("announcements_received_total", "Catalog changes received from members."))),
		sendErrors:  prometheus.NewCounter(prometheus.CounterOpts(opts("send_errors_total", "Announcement messages that could not be sent."))),
		badMessages: prometheus.NewCounter(prometheus.CounterOpts(opts("bad_messages_total", "Gossip packets and streams dropped as malformed, foreign or not decryptable, by memberlist or by the peer (their log lines are rate-limited)."))),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts(opts("rejected_members_total",
			"Nodes kept out of membership, by reason: no_proof, bad_proof, untrusted_cert (not the cluster CA's, or not valid now), awaiting_cert (its certificate being fetched; normal for a moment at a join). Only with mutual TLS.")),
			[]string{"reason"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts(opts("snapshot_syncs_total", "Catalog snapshots pulled from members, by result.")),
			[]string{"result"}),
		fetchPages: prometheus.NewCounterVec(prometheus.CounterOpts(opts("fetched_pages_total", "Pages fetched from members for loads, by result.")),
			[]string{"result"}),
		fetchBytes: prometheus.NewCounter(prometheus.CounterOpts(opts("fetched_bytes_total", "Page bytes fetched from members and verified."))),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts(opts("summary_claims_total",
			"Runs of pages a member's compact summary claimed that a lookup had the member confirm, by result: held (all of it), false (a false positive: fewer pages, one RPC spent).")),
			[]string{"result"}),
	}
	reg.MustRegister(m.members, m.announced, m.received, m.sendErrors, m.badMessages, m.rejected, m.syncs, m.fetchPages, m.fetchBytes, m.claims,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("remote_pages", "Pages other members announced (distinct keys).")),
			func() float64 { return float64(remote.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("summary_bytes", "Memory of the compact summaries (filters) members published, in bytes.")),
			func() float64 { return float64(remote.Summarized()) }))
	m.initLabels()
	return m
}

// initLabels makes every result the cluster's counters can take visible
// at zero from the start (a rate() over them is defined before the first
// event).
func (m *clusterMetrics) initLabels() {
	for _, result := range []string{"ok", "failed"} {
		m.syncs.WithLabelValues(result)
	}
	for _, reason := range rejectReasons {
		m.rejected.WithLabelValues(reason)
	}
	for _, result := range []string{"ok", "missing", "corrupt", "failed"} {
		m.fetchPages.WithLabelValues(result)
	}
	for _, result := range []string{"held", "false"} {
		m.claims.WithLabelValues(result)
	}
}

// New prepares the cluster state before the catalog opens (the catalog's
// change feed goes to Announce). Nothing listens yet; dataDir keeps the
// node name when cfg names none.
func New(cfg Config, dataDir string, reg *prometheus.Registry, log zerolog.Logger) (*Cluster, error) {
	name, err := nodeName(cfg, dataDir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		cfg: cfg, name: name, incarnation: newIncarnation(), log: log.With().Str("node", name).Logger(),
		remote: newIndex(), origins: map[string]*origin{}, byID: map[int]*origin{}, conns: map[string]*grpc.ClientConn{},
		wake: make(chan struct{}, 1), syncs: make(chan struct{}, maxSyncs),
	}
	if cfg.TLSCert != "" {
		t, err := pki.LoadFiles(cfg.TLSCert, cfg.TLSKey, cfg.TLSCA)
		if err != nil {
			return nil, err
		}
		c.tls = &t
		if c.auth, err = newAuth(t.Roots, t.Client, t.Cert); err != nil {
			return nil, err
		}
	}
	c.m = newClusterMetrics(reg, c.remote)
	c.remote.members = c
	c.served.register(reg)
	c.m.members.Set(1)
	c.data = tcp.NewClient(c.clientTLS())
	c.rd = newRDMASide(cfg.RDMA, reg, c.log)
	c.leases = newLeaseTable(reg)
	return c, nil
}

// nodeName is the configured node name, or one kept in the data directory:
// the host name and a random suffix, so that peers sharing a host name (one
// per network namespace, containers) stay apart and a restart keeps it.
func nodeName(cfg Config, dataDir string) (string, error) {
	if cfg.NodeName != "" {
		return cfg.NodeName, nil
	}
	path := filepath.Join(dataDir, "node-name")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%06x", host, newIncarnation()&0xffffff)
	if err := os.WriteFile(path, []byte(name+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return name, nil
}

// Start listens on the peer and data addresses, joins the cluster and runs
// the sender and the syncer until ctx ends; stop leaves and closes. cat is
// the catalog the peer service's snapshots read; src serves the data plane.
func (c *Cluster) Start(ctx context.Context, cat *catalog.Catalog, src tcp.Source) (stop func(), err error) {
	cfg := c.cfg
	c.cat = cat
	if cfg.CompactCatalog {
		c.startSummary()
	}
	peerLis, err := net.Listen("tcp", cfg.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("peer listener: %w", err)
	}
	dataLis, err := net.Listen("tcp", cfg.DataAddr)
	if err != nil {
		peerLis.Close()
		return nil, fmt.Errorf("data plane listener: %w", err)
	}
	var opts []grpc.ServerOption
	if c.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(c.tls.Server)))
	}
	c.dataSrv = tcp.NewServer(src, c.serverTLS())
	c.served.srv.Store(c.dataSrv)
	c.dataSrv.OnError = func(remote string, err error) {
		c.log.Warn().Err(err).Str("remote", remote).Msg("data plane connection ended")
	}
	// Both follow the cores (transfer/tcp: on from GOMAXPROCS 4); say which.
	mode := "answers written in one go, fetched pages checksummed as read (under 4 cores)"
	if c.dataSrv.PrefetchBytes > 0 {
		mode = "answers read ahead of their writes, fetched pages checksummed behind the reads while other fetches run, else as read"
	}
	c.log.Info().Int("read_ahead_bytes", c.dataSrv.PrefetchBytes).Str("verify", c.data.Verify.String()).
		Int("gomaxprocs", runtime.GOMAXPROCS(0)).Str("crc32c", crc32c.Kernel()).Msg("tcp data plane: " + mode)
	c.rd.open(ibv.Open) // logs the data plane: RDMA, or why TCP
	if p, ok := src.(Placer); ok {
		if err := c.rd.registerDRAM(p); err != nil { // members' reads of this peer then go over TCP
			c.log.Warn().Err(err).Msg("rdma: dram pool not registered; members fetch its pages over TCP")
		}
	}
	c.peerSrv = grpc.NewServer(opts...)
	pb.RegisterPeerServiceServer(c.peerSrv, &peerServer{c: c})
	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.peerSrv.Serve(peerLis) }()
	go func() { defer c.wg.Done(); c.dataSrv.Serve(dataLis) }()

	if c.auth == nil {
		c.log.Warn().Msg("membership is not authenticated: without --tls-cert/--tls-key/--tls-ca any node that reaches the gossip " +
			"port (and holds the gossip key, if one is set) is listed as a member")
	}
	ml, err := c.createMemberlist(cfg, peerLis.Addr(), dataLis.Addr())
	if err != nil {
		if c.auth != nil {
			c.auth.close()
		}
		c.peerSrv.Stop()
		c.dataSrv.Close()
		c.wg.Wait()
		c.rd.close()
		return nil, err
	}
	c.ml = ml
	ctx, cancel := context.WithCancel(ctx)
	c.wg.Add(5)
	go func() { defer c.wg.Done(); c.rejoin.run(ctx, c.ml.Join, c.log) }()
	go func() { defer c.wg.Done(); c.rd.run(ctx, c.rdmaMembers, c.exchangeRDMA) }()
	go func() { defer c.wg.Done(); c.runSender(ctx) }()
	go func() { defer c.wg.Done(); c.runSyncer(ctx) }()
	go func() { defer c.wg.Done(); c.joinLoop(ctx, splitList(cfg.ClusterJoin)) }()
	c.mu.Lock()
	peerAddr, dataAddr := c.peerAddr, c.dataAddr
	c.mu.Unlock()
	c.log.Info().Str("gossip", ml.LocalNode().Address()).Str("peer", peerAddr).Str("data", dataAddr).
		Bool("mtls", c.tls != nil).Bool("gossip_encrypted", cfg.ClusterKeyFile != "").Msg("cluster member")
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := ml.Leave(time.Second); err != nil {
				c.log.Warn().Err(err).Msg("leave")
			}
			ml.Shutdown()
			if c.auth != nil {
				c.auth.close()
			}
			c.logLimit.flush(c.log)
			c.peerSrv.Stop()
			c.leases.closeAll()
			c.dataSrv.Close()
			c.data.Close()
			c.wg.Wait()
			c.rd.close()
			c.mu.Lock()
			for _, cc := range c.conns {
				cc.Close()
			}
			// Lookups stop offering members' pages: the client is closed.
			for _, o := range c.origins {
				o.state = stateLeft
			}
			c.mu.Unlock()
		})
	}, nil
}

func (c *Cluster) createMemberlist(cfg Config, peer, data net.Addr) (*memberlist.Memberlist, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.name
	host, port, err := splitHostPort(cfg.ClusterAddr)
	if err != nil {
		return nil, fmt.Errorf("cluster-addr: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	if cfg.ClusterAdvertise != "" {
		ah, ap, err := splitHostPort(cfg.ClusterAdvertise)
		if err != nil {
			return nil, fmt.Errorf("cluster-advertise: %w", err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ah, ap
	}
	if cfg.ClusterKeyFile != "" {
		key, err := readClusterKey(cfg.ClusterKeyFile)
		if err != nil {
			return nil, err
		}
		mc.SecretKey = key
	}
	mc.PushPullInterval = 5 * time.Second
	mc.DeadNodeReclaimTime = 10 * time.Second // a peer restarted elsewhere may take its name back
	mc.Logger = log.New(memberlistLog{log: c.log, limit: &c.logLimit, bad: c.m.badMessages.Inc}, "", 0)
	d := &mlDelegate{c: c}
	mc.Delegate, mc.Events, mc.Alive, mc.Merge = d, d, d, d
	// The advertised addresses of the peer service and data plane take the
	// host others reach the gossip at when they listen on every address.
	c.mu.Lock()
	c.peerAddr, c.dataAddr = peer.String(), data.String()
	c.mu.Unlock()
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("memberlist: %w", err)
	}
	c.mlp.Store(ml)
	adv := ml.LocalNode().Addr.String()
	c.mu.Lock()
	c.peerAddr, c.dataAddr = advertised(peer, adv), advertised(data, adv)
	c.gossipAddr = ml.LocalNode().Address()
	// With mutual TLS the metadata is signed over the gossip address, known
	// only now: published again before any join.
	republish := c.peerAddr != peer.String() || c.dataAddr != data.String() || c.auth != nil
	c.mu.Unlock()
	if republish {
		if err := ml.UpdateNode(5 * time.Second); err != nil {
			c.log.Warn().Err(err).Msg("republishing the advertised addresses")
		}
	}
	return ml, nil
}

// advertised replaces an unspecified listen host by the gossip's host.
func advertised(a net.Addr, host string) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return a.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(ta.Port))
}

// joinLoop joins through the seeds, retrying every second until one
// answers (seeds may start later than this peer).
func (c *Cluster) joinLoop(ctx context.Context, seeds []string) {
	if len(seeds) == 0 {
		return
	}
	for wait := time.Duration(0); ; wait = time.Second {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		n, err := c.ml.Join(seeds)
		if n > 0 {
			c.log.Info().Int("contacted", n).Msg("joined the cluster")
			return
		}
		c.log.Warn().Err(err).Strs("seeds", seeds).Msg("no seed answered; retrying")
	}
}

func (c *Cluster) peerConn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls.Client)
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// readClusterKey reads the gossip encryption key: 16, 24 or 32 bytes,
// base64 in the file (`orbitkv pki init` writes one).
func readClusterKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("cluster key %s: not base64: %w", path, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("cluster key %s: %d bytes, want 16, 24 or 32", path, n)
	}
	return key, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q", p)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// mlDelegate connects memberlist to the cluster.
type mlDelegate struct{ c *Cluster }

func (d *mlDelegate) NodeMeta(limit int) []byte {
	d.c.mu.Lock()
	defer d.c.mu.Unlock()
	b := meta{incarnation: d.c.incarnation, peerAddr: d.c.peerAddr, dataAddr: d.c.dataAddr, rdma: d.c.rd.local() == "",
		compact: d.c.cfg.CompactCatalog}.encode()
	if d.c.auth != nil && d.c.gossipAddr != "" { // "": inside memberlist.Create, before any join (createMemberlist republishes)
		signed, err := d.c.auth.sign(d.c.name, d.c.gossipAddr, b)
		if err != nil {
			d.c.log.Error().Err(err).Msg("node metadata not signed: members refuse this peer")
		} else {
			b = signed
		}
	}
	if len(b) > limit {
		d.c.log.Error().Int("bytes", len(b)).Int("limit", limit).Msg("node metadata too long")
		return nil
	}
	return b
}

// NotifyMsg gets a member's message; memberlist reuses the buffer.
func (d *mlDelegate) NotifyMsg(b []byte) { d.c.receive(append([]byte(nil), b...)) }

func (d *mlDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

func (d *mlDelegate) LocalState(join bool) []byte {
	return encodeState(d.c.name, d.c.incarnation, d.c.currentSeq())
}

func (d *mlDelegate) MergeRemoteState(buf []byte, join bool) { d.c.receiveState(buf) }

// NotifyAlive (memberlist's AliveDelegate) lets a node into the view only
// with a valid proof of identity (auth.go); NotifyMerge (MergeDelegate)
// refuses a join's push/pull of nodes that all lack one.
func (d *mlDelegate) NotifyAlive(n *memberlist.Node) error       { return d.c.admit(n) }
func (d *mlDelegate) NotifyMerge(nodes []*memberlist.Node) error { return d.c.admitMerge(nodes) }

func (d *mlDelegate) NotifyJoin(n *memberlist.Node)   { d.c.memberUp(n) }
func (d *mlDelegate) NotifyUpdate(n *memberlist.Node) { d.c.memberUp(n) }
func (d *mlDelegate) NotifyLeave(n *memberlist.Node)  { d.c.memberDown(n) }

// peerServer is the PeerService.
type peerServer struct {
	pb.UnimplementedPeerServiceServer
	c *Cluster
}

// Snapshot streams the catalog: the sequence number is read before the
// catalog, so every change up to it is in what follows (changes after it
// may be too; their announcements apply on top idempotently).
func (s *peerServer) Snapshot(req *pb.SnapshotRequest, stream pb.PeerService_SnapshotServer) error {
	c := s.c
	if c.cfg.CompactCatalog {
		return s.snapshotSummary(stream)
	}
	chunk := &pb.SnapshotChunk{Origin: c.name, Incarnation: c.incarnation, Seq: c.currentSeq()}
	buf := make([]byte, 0, snapshotChunk*snapshotEntrySize)
	var sendErr error
	c.cat.Range(func(e catalog.Entry) bool {
		if e.Tier() == catalog.TierNone {
			return true
		}
		buf = appendSnapshotEntry(buf, e)
		if len(buf) < cap(buf) {
			return true
		}
		chunk.Entries = buf
		if sendErr = stream.Send(chunk); sendErr != nil {
			return false
		}
		// gRPC may read a sent message lazily: a new buffer each chunk.
		chunk, buf = &pb.SnapshotChunk{}, make([]byte, 0, snapshotChunk*snapshotEntrySize)
		return true
	})
	if sendErr != nil {
		return sendErr
	}
	chunk.Entries = buf
	return stream.Send(chunk)
}

// ExchangeRDMA accepts a member's RDMA connection data (rdma.go).
func (s *peerServer) ExchangeRDMA(ctx context.Context, req *pb.RDMAExchange) (*pb.RDMAExchange, error) {
	wire, err := s.c.rd.accept(senderOf(ctx, req.From), req.ConnInfo)
	if err != nil {
		return nil, err
	}
	return &pb.RDMAExchange{From: s.c.name, ConnInfo: wire}, nil
}

// PlacePages answers where the asked pages are in this peer's DRAM and
// pins them for a lease (place.go's comment).
func (s *peerServer) PlacePages(ctx context.Context, req *pb.PlaceRequest) (*pb.PlaceReply, error) {
	rd := s.c.rd
	if rd.dram == nil {
		return nil, status.Error(codes.FailedPrecondition, "no dram region registered for rdma: "+rd.local())
	}
	wants, err := placeWants(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	placed, release := rd.placer.PlaceDRAM(wants)
	reply := &pb.PlaceReply{Pages: make([]*pb.PagePlacement, len(placed))}
	n := 0
	for i, p := range placed {
		reply.Pages[i] = &pb.PagePlacement{}
		if p.OK {
			n++
			reply.Pages[i] = &pb.PagePlacement{InDram: true, Region: rd.dram.Key, Offset: p.Off, Length: p.Header.Length,
				Checksum: p.Header.Checksum, Generation: p.Header.Generation}
		}
	}
	if n == 0 {
		release()
		return reply, nil
	}
	ttl := leaseTTL(req.LeaseMs)
	if reply.Lease, err = s.c.leases.grant(senderOf(ctx, req.From), ttl, release); err != nil {
		release()
		if errors.Is(err, errLeasesClosed) {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	reply.LeaseMs = uint32(ttl / time.Millisecond)
	return reply, nil
}

// ReleasePlacements ends the caller's lease.
func (s *peerServer) ReleasePlacements(ctx context.Context, req *pb.ReleasePlacementsRequest) (*pb.ReleasePlacementsReply, error) {
	return &pb.ReleasePlacementsReply{Released: s.c.leases.end(req.Lease, senderOf(ctx, req.From), "released")}, nil
}

// senderOf is the calling member: its mutual-TLS certificate's name, or
// (a cluster without TLS, --cluster-insecure) the name it gives.
func senderOf(ctx context.Context, from string) string {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			return ti.State.PeerCertificates[0].Subject.CommonName
		}
	}
	return from
}

// rdmaMembers maps each live member to whether it advertised a device.
func (c *Cluster) rdmaMembers() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.origins))
	for _, o := range c.origins {
		if o.state == stateAlive {
			out[o.name] = o.rdma
		}
	}
	return out
}

// exchangeRDMA sends local to member's peer service and returns its answer.
func (c *Cluster) exchangeRDMA(ctx context.Context, member string, local ibv.ConnInfo) (ibv.ConnInfo, error) {
	c.mu.Lock()
	addr := ""
	if o := c.origins[member]; o != nil {
		addr = o.peerAddr
	}
	c.mu.Unlock()
	if addr == "" {
		return ibv.ConnInfo{}, fmt.Errorf("member %s left", member)
	}
	wire, err := local.Marshal()
	if err != nil {
		return ibv.ConnInfo{}, err
	}
	cc, err := c.peerConn(addr)
	if err != nil {
		return ibv.ConnInfo{}, err
	}
	resp, err := pb.NewPeerServiceClient(cc).ExchangeRDMA(ctx, &pb.RDMAExchange{From: c.name, ConnInfo: wire})
	if err != nil {
		return ibv.ConnInfo{}, fmt.Errorf("exchange with %s: %w", member, err)
	}
	return ibv.UnmarshalConnInfo(resp.ConnInfo)
}

func (c *Cluster) clientTLS() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.Client
}

func (c *Cluster) serverTLS() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.Server
}

// peerClient is the peer service of member.
func (c *Cluster) peerClient(member string) (pb.PeerServiceClient, error) {
	c.mu.Lock()
	addr := ""
	if o := c.origins[member]; o != nil {
		addr = o.peerAddr
	}
	c.mu.Unlock()
	if addr == "" {
		return nil, fmt.Errorf("member %s left", member)
	}
	cc, err := c.peerConn(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewPeerServiceClient(cc), nil
}

// Authenticated membership: memberlist's AliveDelegate and MergeDelegate
// (the check itself: auth.go).

// admit is memberlist's NotifyAlive: nil lets n into the view.
func (c *Cluster) admit(n *memberlist.Node) error {
	if c.auth == nil || n.Name == c.name {
		return nil // no CA (dev cluster, logged at Start), or this peer itself (memberlist refutes impostors)
	}
	reason, fetch, err := c.checkNode(n)
	if err == nil {
		return nil
	}
	if fetch != nil {
		c.auth.start(fetch, func(f *certFetch, err error) { c.fetched(n.Name, f, err) })
	}
	c.refused(n.Name, reason, err)
	return fmt.Errorf("%w (%s): %v", errNotMember, reason, err)
}

// admitMerge is memberlist's NotifyMerge (a join's push/pull): it refuses
// the merge when no node in it other than this peer is a member or awaits
// its certificate, as when a node without the cluster's identity joins;
// in a mixed state each node is decided by admit as it is merged.
func (c *Cluster) admitMerge(nodes []*memberlist.Node) error {
	if c.auth == nil {
		return nil
	}
	var first error
	var firstName, firstReason string
	others := 0
	for _, n := range nodes {
		if n.Name == c.name {
			continue
		}
		others++
		reason, _, err := c.checkNode(n)
		if err == nil || reason == rejectAwaiting {
			return nil
		}
		if first == nil {
			first, firstName, firstReason = err, n.Name, reason
		}
	}
	if others == 0 {
		return nil
	}
	c.refused(firstName, firstReason, first)
	return fmt.Errorf("%w (%s): %s: %v", errNotMember, firstReason, firstName, first)
}

// fetched ends a member's certificate fetch: verified, this peer pulls the
// member's state (its alive message is decided again, now with the
// certificate); refused, it is counted.
func (c *Cluster) fetched(name string, f *certFetch, err error) {
	if err != nil {
		c.refused(name, rejectUntrusted, err)
		return
	}
	ml := c.mlp.Load()
	if ml == nil {
		return
	}
	if _, err := ml.Join([]string{f.gossip}); err != nil {
		c.log.Debug().Err(err).Str("member", name).Msg("pulling a verified member's state")
	}
}

// refused counts and logs (rate-limited) a node kept out of membership.
func (c *Cluster) refused(name, reason string, err error) {
	c.m.rejected.WithLabelValues(reason).Inc()
	level := zerolog.WarnLevel
	if reason == rejectAwaiting {
		level = zerolog.DebugLevel
	}
	if level == zerolog.DebugLevel {
		c.log.Debug().Err(err).Str("member", name).Str("reason", reason).Msg("node not let into membership yet")
		return
	}
	c.logLimit.event(c.log, level).Err(err).Str("member", name).Str("reason", reason).
		Msg("node refused membership: no valid proof of a certificate from the cluster CA (orbitkv_cluster_rejected_members_total)")
}

// expireMembers takes out the members whose certificate stopped being
// valid since they joined: their alive messages are refused from then on,
// but memberlist keeps a member in its own view until it fails or leaves,
// so this peer stops offering its pages and sending to it now.
func (c *Cluster) expireMembers() {
	if c.auth == nil {
		return
	}
	type gone struct {
		name string
		cert certEntry
	}
	var out []gone
	c.mu.Lock()
	for _, o := range c.origins {
		if o.cert == nil {
			continue
		}
		if e, expired := c.auth.expired(*o.cert); expired {
			out = append(out, gone{o.name, e})
		}
	}
	c.mu.Unlock()
	for _, g := range out {
		c.forgetMember(g.name, false)
		c.refused(g.name, rejectUntrusted, fmt.Errorf("certificate %q valid from %s to %s only: the member is dropped",
			g.cert.subject, g.cert.notBefore.Format(time.RFC3339), g.cert.notAfter.Format(time.RFC3339)))
	}
}

// checkNode is auth's check of n's metadata.
func (c *Cluster) checkNode(n *memberlist.Node) (reason string, fetch *certFetch, err error) {
	md, err := decodeMeta(n.Meta)
	if err != nil {
		return rejectBadProof, nil, err
	}
	return c.auth.check(n, md.proof, md.signed, md.peerAddr)
}

// startSummary builds this peer's filter from its catalog (Start; changes
// before it were not counted: the catalog has them).
func (c *Cluster) startSummary() {
	keys := map[pagekey.Key]struct{}{}
	c.out.Lock()
	defer c.out.Unlock()
	c.cat.Range(func(e catalog.Entry) bool {
		if e.Tier() != catalog.TierNone {
			keys[e.Key] = struct{}{}
		}
		return true
	})
	c.out.own = newOwnSummary(keys)
}

// snapshotSummary serves this peer's filter, with the sequence number of
// the last change it includes.
func (s *peerServer) snapshotSummary(stream pb.PeerService_SnapshotServer) error {
	c := s.c
	c.out.Lock()
	seq := c.out.seq
	var f catalog.Filter
	if c.out.own != nil {
		f = c.out.own.s.Filter()
	}
	c.out.Unlock()
	const wordsPerChunk = snapshotChunk * snapshotEntrySize / 8
	chunk := &pb.SnapshotChunk{Origin: c.name, Incarnation: c.incarnation, Seq: seq}
	for {
		n := min(len(f), wordsPerChunk)
		chunk.Entries, f = appendFilter(make([]byte, 0, 8*n), f[:n]), f[n:]
		if err := stream.Send(chunk); err != nil {
			return err
		}
		if len(f) == 0 {
			return nil
		}
		chunk = &pb.SnapshotChunk{}
	}
}

// noteClaim counts a confirmed claim.
func (c *Cluster) noteClaim(falseClaim bool) {
	result := "held"
	if falseClaim {
		result = "false"
	}
	c.m.claims.WithLabelValues(result).Inc()
}
