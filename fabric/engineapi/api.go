package engineapi

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/cluster"
	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// API is the engine and admin services of one peer: its sessions, their
// operations and leases, over the store, the catalog and the cluster it
// is given.
type API struct {
	cfg          Limits
	log          zerolog.Logger
	cat          *catalog.Catalog
	pages        *store.Store
	cluster      *cluster.Cluster // nil when standalone
	gpu          GPU              // nil without a usable GPU
	ssd          *ssd.Store       // nil without an SSD tier
	dataDir      string
	maxPageBytes bytesize.Size
	health       func(now time.Time) string
	startRepair  string
	version      string
	started      time.Time
	now          func() time.Time
	sessions     *sessions
	m            *metrics
}

// Deps are what the engine API serves from; fabric.New fills them.
type Deps struct {
	Catalog *catalog.Catalog
	Store   *store.Store
	Cluster *cluster.Cluster // nil: standalone
	GPU     GPU              // nil: no usable GPU (CUDA sessions are refused)
	SSD     *ssd.Store       // nil: no SSD tier (Status and Drain read its counters)
	// DataDir is the peer's data dir, absolute with symlinks resolved: no
	// engine buffer may live in it (buffers.go).
	DataDir string
	// MaxPageBytes is the largest page a session may declare (the DRAM slab).
	MaxPageBytes bytesize.Size
	// Health says why the peer is unhealthy at now ("" when it is not).
	Health func(now time.Time) string
	// StartRepair says what the start repaired in the catalog ("" for nothing).
	StartRepair string
	Version     string
	Started     time.Time
	Registry    *prometheus.Registry
	Log         zerolog.Logger
	// Now is the clock of lease expiry, keepalives and the access time
	// lookups stamp on the pages they hit (nil: time.Now).
	Now func() time.Time
}

// New returns the engine API; nothing serves until Register.
func New(cfg Limits, d Deps) *API {
	if d.Now == nil {
		d.Now = time.Now
	}
	return &API{cfg: cfg, log: d.Log, cat: d.Catalog, pages: d.Store, cluster: d.Cluster, gpu: d.GPU, ssd: d.SSD,
		dataDir: d.DataDir, maxPageBytes: d.MaxPageBytes, health: d.Health, startRepair: d.StartRepair, version: d.Version,
		started: d.Started, now: d.Now, sessions: newSessions(), m: newMetrics(d.Registry)}
}

// Register registers the engine and admin services on srv.
func (p *API) Register(srv *grpc.Server) {
	pb.RegisterEngineServiceServer(srv, &engineServer{p: p})
	pb.RegisterAdminServiceServer(srv, &adminServer{p: p})
}

// Engine returns the store's view of a session (tools and tests that drive
// the store directly, or give a session a fake device transport, use it).
func (p *API) Engine(sessionID string) (*store.Engine, error) {
	s, err := p.sessions.get(sessionID)
	if err != nil {
		return nil, err
	}
	return &s.Engine, nil
}
