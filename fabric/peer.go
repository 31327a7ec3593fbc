package fabric

import (
	"context"
	"errors"
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/store"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/cluster"
	"github.com/orbitkv/orbitkv/fabric/engineapi"
	"github.com/orbitkv/orbitkv/internal/buildinfo"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// Version is the peer's version, git revision and Go toolchain, stamped by
// the build (internal/buildinfo).
var Version = buildinfo.String()

// Peer is one host's OrbitKV peer.
type Peer struct {
	cfg     Config
	log     zerolog.Logger
	started time.Time
	cat     *catalog.Catalog
	pool    *dram.Pool
	ssd     *ssd.Store
	pages   *store.Store
	api     *engineapi.API // the engine and admin services; set at the end of New
	m       *metrics
	gpu     *gpuState        // nil without a usable GPU (see gpu.go)
	cluster *cluster.Cluster // nil when standalone (fabric/cluster)
	dataDir string           // cfg.DataDir absolute, symlinks resolved (checkBufferPath)
	dirLock *dirLock         // held from New until Close or a failed start is undone (datadir_lock.go)
	// startRepair says what the start repaired in the catalog, for Status
	// ("" for nothing); set once in New, read-only afterwards.
	startRepair string

	ready       chan struct{} // closed once Run serves
	metricsBind string        // the bound metrics address; set before ready

	closeOnce sync.Once
	closeErr  error
}

// now is the clock of the peer's decisions (Config.Now).
func (p *Peer) now() time.Time {
	if p.cfg.Now != nil {
		return p.cfg.Now()
	}
	return time.Now()
}

// metricsAddr waits until the peer serves and returns its metrics address.
func (p *Peer) metricsAddr() string {
	<-p.ready
	return p.metricsBind
}

// New opens the tiers and the catalog, recovering SSD-resident pages.
func New(cfg Config, log zerolog.Logger) (*Peer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	dataDir, err := realDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	p := &Peer{cfg: cfg, log: log, ready: make(chan struct{}), dataDir: dataDir}
	p.started = p.now()
	if p.dirLock, err = lockDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	marker, marked, err := takeCleanMarker(cfg.DataDir) // cleanstop.go: gone before anything is written
	if err != nil {
		p.dirLock.release()
		return nil, err
	}
	existing, err := pageFilesIn(cfg.DataDir) // before openTiers creates them
	if err != nil {
		p.dirLock.release()
		return nil, err
	}
	if err := p.openTiers(); err != nil {
		p.closeTiers()
		p.dirLock.release()
		return nil, err
	}
	budget, capped := queryBudget(uint64(cfg.QueryBudgetBytes), p.pool.Stats().CapacityBytes) // config.go
	if capped {
		log.Warn().Uint64("query_budget_bytes", budget).Msg("query budget capped at half the dram pool")
	}
	p.pages = store.New(p.cat, p.pool, p.ssd, p.storeOptions(budget))
	gpu, err := openGPU(p.cfg, p.pages.DRAMRegion(), p.pages.AddHBMStage, log)
	if err != nil {
		p.abandonStart()
		return nil, err
	}
	p.gpu = gpu
	if gpu != nil && p.cluster != nil { // a nil *cluster.Cluster must not become a non-nil registrar
		gpu.verbs = p.cluster
	}
	mode, why := startScan(p.cat, p.ssd, marker, marked, existing) // cleanstop.go
	sc, err := p.pages.ScanSSD(filepath.Join(cfg.DataDir, "ssd"), mode)
	if err != nil {
		p.abandonStart()
		return nil, fmt.Errorf("scan ssd page files: %w", err)
	}
	if err := p.pages.FitSSDTier(&sc); err != nil { // before recover drops what the tier does not hold
		p.abandonStart()
		return nil, err
	}
	rep, err := p.pages.Recover(sc)
	if err != nil {
		p.abandonStart()
		return nil, fmt.Errorf("recover catalog: %w", err)
	}
	p.logRecovery(rep, why)
	p.api = engineapi.New(cfg.Limits, p.apiDeps())
	return p, nil
}

// apiDeps are what the engine API serves from.
func (p *Peer) apiDeps() engineapi.Deps {
	d := engineapi.Deps{Catalog: p.cat, Store: p.pages, Cluster: p.cluster, SSD: p.ssd, DataDir: p.dataDir,
		MaxPageBytes: p.cfg.DRAMSlabBytes, Health: p.problem, StartRepair: p.startRepair, Version: Version,
		Started: p.started, Registry: p.m.reg, Log: p.log, Now: p.now}
	if p.gpu != nil { // a nil *gpuState must not become a non-nil GPU
		d.GPU = p.gpu
	}
	return d
}

// storeOptions are the store's options from the peer's config.
func (p *Peer) storeOptions(budget uint64) store.Options {
	o := store.Options{QueryBudget: budget, SSDDir: filepath.Join(p.cfg.DataDir, "ssd"), SSDDiscard: p.cfg.SSDDiscard, NoReadmit: p.cfg.SSDNoReadmit, ReadmitAll: p.cfg.SSDReadmitAll,
		SSDBytes: p.cfg.SSDBytes, SSDFileBytes: p.cfg.SSDFileBytes, Registry: p.m.reg, Log: p.log, Now: p.now}
	if p.cluster != nil { // a nil *cluster.Cluster must not become a non-nil Members
		o.Members = p.cluster
	}
	return o
}

func (p *Peer) openTiers() error {
	var err error
	p.pool, err = dram.New(dram.Config{Bytes: uint64(p.cfg.DRAMBytes), SlabBytes: uint64(p.cfg.DRAMSlabBytes)})
	if err != nil {
		return fmt.Errorf("dram tier: %w", err)
	}
	if p.cfg.SSDBytes > 0 {
		sync := ssd.SyncBatch
		if p.cfg.SSDNoSync {
			sync = ssd.SyncNone
		}
		fs := p.cfg.SSDFS
		if fs == nil && p.cfg.SSDSparse {
			fs = ssd.SparseOS
		}
		p.ssd, err = ssd.Open(ssd.Config{Dir: filepath.Join(p.cfg.DataDir, "ssd"), CapacityBytes: uint64(p.cfg.SSDBytes),
			FileBytes: uint64(p.cfg.SSDFileBytes), QueueDepth: p.cfg.SSDQueueDepth, Sync: sync, FS: fs})
		if err != nil {
			return fmt.Errorf("ssd tier: %w", err)
		}
	}
	p.m = newMetrics()
	registerPoolGauges(p.m.reg, p.pool) // observe.go
	p.m.reg.MustRegister(newGPUBatches(p.CUDAStats))
	opts := catalog.Options{Dir: filepath.Join(p.cfg.DataDir, "catalog")}
	if p.cfg.ClusterAddr != "" {
		if p.cluster, err = cluster.New(p.cfg.Config, p.cfg.DataDir, p.m.reg, p.log); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		opts.OnChange = p.cluster.Announce
	}
	p.cat, err = catalog.Open(opts)
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	return nil
}

// Run serves the engine and admin APIs on the Unix socket and metrics over
// HTTP until ctx ends, then closes the peer.
func (p *Peer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx) // a server error also stops the reaper and sealer
	defer cancel()
	lis, err := listenUnix(p.cfg.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(16<<20), grpc.MaxConcurrentStreams(1024), grpc.ChainUnaryInterceptor(p.m.rpc.unary))
	p.api.Register(srv)
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() { defer wg.Done(); errc <- srv.Serve(lis) }()
	lane := p.serveLane(&wg)
	metricsAddr, stopMetrics, err := p.serveMetrics(&wg, errc)
	if err != nil {
		lane.Close()
		srv.Stop()
		wg.Wait()
		return err
	}
	stopCluster := func() {}
	if p.cluster != nil {
		if stopCluster, err = p.cluster.Start(ctx, p.cat, p.pages); err != nil {
			stopMetrics()
			lane.Close()
			srv.Stop()
			wg.Wait()
			return fmt.Errorf("cluster: %w", err)
		}
	}
	wg.Add(1)
	go func() { defer wg.Done(); p.api.Reap(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); p.pages.RunSealer(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); p.pages.RunFlusher(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); p.pages.RunAsks(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); p.watchCatalog(ctx) }()
	p.metricsBind = metricsAddr
	close(p.ready)
	p.log.Info().Str("socket", p.cfg.Socket).Str("metrics", metricsAddr).Str("version", Version).Msg("serving")
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	p.log.Info().Msg("shutting down")
	stopCluster() // leave first: members stop offering our pages
	cancel()
	stopMetrics()
	p.api.CloseSessions()
	lane.Close()
	srv.Stop()
	wg.Wait()
	return errors.Join(err, p.Close())
}

// LaneSuffix names the engine lane's socket: the API socket's path plus it.
const LaneSuffix = ".lane"

// serveLane starts the engine lane (engineapi/lane.go) on the socket's
// path plus LaneSuffix. A peer that cannot listen there, or whose lane
// fails, serves without it (engines fall back to gRPC) and says why.
func (p *Peer) serveLane(wg *sync.WaitGroup) *engineapi.Lane {
	lane := p.api.NewLane(p.m.rpc.unary)
	path := p.cfg.Socket + LaneSuffix
	lis, err := listenUnix(path)
	if err != nil {
		p.log.Warn().Err(err).Str("socket", path).Msg("engine lane unavailable: engines use gRPC only")
		return lane
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := lane.Serve(lis); err != nil {
			p.log.Error().Err(err).Msg("engine lane stopped: engines use gRPC only")
		}
	}()
	return lane
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket path %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another peer", path)
		}
		os.Remove(path) // stale socket of a dead peer
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restrict socket permissions: %w", err)
	}
	return lis, nil
}

// serveMetrics starts the /metrics endpoint; it returns the bound address.
func (p *Peer) serveMetrics(wg *sync.WaitGroup, errc chan<- error) (string, func(), error) {
	if p.cfg.MetricsAddr == "" {
		return "", func() {}, nil
	}
	lis, err := net.Listen("tcp", p.cfg.MetricsAddr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(p.m.reg, promhttp.HandlerOpts{}))
	p.handleProbes(mux)                                                                                 // /healthz, /readyz (probes.go)
	mux.Handle("POST /v1/route", routeHandler(p.api.Route))                                             // route_http.go
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second} // a route body is read by then
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}
	return lis.Addr().String(), stop, nil
}

// Close releases everything; it is idempotent.
func (p *Peer) Close() error {
	p.closeOnce.Do(func() {
		var mark *cleanMarker
		if p.api != nil {
			p.api.CloseSessions()
			if p.cat.Health() == nil {
				m := catalogDigest(p.cat)
				mark = &m
			}
		}
		err := p.closeTiers()
		if err == nil && mark != nil { // all closed, nothing in flight: the next start need not scan (cleanstop.go)
			if merr := writeCleanMarker(p.cfg.DataDir, *mark); merr != nil {
				p.log.Warn().Err(merr).Msg("clean-shutdown marker not written: the next start checks the page files")
			}
		}
		p.closeErr = errors.Join(err, p.dirLock.release()) // the lock last: nothing of the data dir is open
	})
	return p.closeErr
}

// abandonStart undoes a start that fails after the tiers opened: the tiers
// are closed and the page files this start created (a refused start may
// have preallocated new ones) are removed, so the disk is as it was.
func (p *Peer) abandonStart() {
	_ = p.closeTiers()
	if p.ssd != nil {
		if err := p.ssd.RemoveCreated(); err != nil {
			p.log.Warn().Err(err).Msg("abandoned start: page files it created")
		}
	}
	p.dirLock.release() // after the removal: no other start sees the files go
}

func (p *Peer) closeTiers() error {
	var errs []error
	if p.cat != nil {
		errs = append(errs, p.cat.Close())
	}
	if p.ssd != nil {
		errs = append(errs, p.ssd.Close())
	}
	errs = append(errs, p.gpu.close()) // unpin before the pool is unmapped
	if p.pool != nil {
		errs = append(errs, p.pool.Close())
	}
	return errors.Join(errs...)
}

// realDir is dir absolute, with symlinks resolved.
func realDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("resolve the data dir %s: %w", dir, err)
	}
	return abs, nil
}
