package soak

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// The engines' buffers: 4 page slots of 128 KiB (4 layers, 2 planes, 4
// blocks of 16 tokens of 2 heads of 64 bf16 values).
var flash = engineclient.Flash{Layers: 4, NumBlocks: 16, BlockTokens: 16, PageTokens: 64, KVHeads: 2, HeadDim: 64, ElemBytes: 2}

const (
	model     = "soak"
	opTimeout = 30 * time.Second // every RPC's deadline: an operation that reaches it is a hang
	// keysPerWorker: each worker owns its keys (one writer per key); with 2
	// workers and the engine processes' 32, a peer has 192 pages of its own
	// (24 MiB): most of its 32 MiB of DRAM, well within its 128 MiB of SSD.
	keysPerWorker = 80
	childKeys     = 32
	workers       = 2
)

func pageSize() int { return flash.Size() / (flash.NumBlocks / (flash.PageTokens / flash.BlockTokens)) }

// keyOf is the page key of key i of a key space.
func keyOf(space string, i int) []byte {
	h := sha256.Sum256([]byte("orbitkv-soak|" + space + "|" + strconv.Itoa(i)))
	return h[:16]
}

// content is the only bytes any save of key k sends: a ChaCha8 stream seeded
// by the key's hash, so a load is checked against the key alone.
func content(k []byte) []byte {
	b := make([]byte, pageSize())
	mrand.NewChaCha8(sha256.Sum256(k)).Read(b)
	return b
}

func blocksOf(slot int) []uint32 {
	per := flash.PageTokens / flash.BlockTokens
	out := make([]uint32, per)
	for i := range out {
		out[i] = uint32(slot*per + i)
	}
	return out
}

// put writes a page's bytes into slot's blocks, in the order the peer
// copies them (layer, plane, block); get reads them back.
func put(mem []byte, slot int, page []byte) {
	off, bb := 0, flash.BlockBytes()
	for l := 0; l < flash.Layers; l++ {
		for pl := 0; pl < 2; pl++ {
			for _, b := range blocksOf(slot) {
				o := flash.BlockOffset(l, pl, int(b))
				copy(mem[o:o+bb], page[off:off+bb])
				off += bb
			}
		}
	}
}

func get(mem []byte, slot int) []byte {
	var out []byte
	for l := 0; l < flash.Layers; l++ {
		for pl := 0; pl < 2; pl++ {
			for _, b := range blocksOf(slot) {
				o := flash.BlockOffset(l, pl, int(b))
				out = append(out, mem[o:o+flash.BlockBytes()]...)
			}
		}
	}
	return out
}

// key is one page key a worker (or the engine processes of a peer) owns.
type key struct {
	k        []byte
	mustHave bool // an SSD save was acknowledged and no SSD eviction was asked for since
}

// peer is one soak peer: its process, restarted on the same data directory.
type peer struct {
	name, ns string
	metrics  string // --metrics-addr
	extra    []string
	dir, log string
	// gate: workers and engine processes hold it shared for each operation;
	// a kill takes it exclusively once the process is dead, until the
	// restarted peer's acknowledged pages are checked.
	gate  sync.RWMutex
	p     atomic.Pointer[proc]
	gen   atomic.Int64
	down  atomic.Bool // from just before a kill until the restart is checked
	dead  atomic.Bool // a restart failed: the run ends in failure
	keys  [workers][]*key
	child []*key
}

func (pr *peer) args() []string { return serveArgs(pr.dir, pr.metrics, pr.extra...) }

// counts are the soak's tallies; the violations fail it.
type counts struct {
	savesSSD, savesDRAM, refused, loads, loadsRemote, remoteMisses, notFound, lookups, leases, evictions atomic.Int64
	childOps, interrupted, refusedLoads, checkRetries, fetchFailures                                     atomic.Int64
	engineKills, peerKills, partitions, checked                                                          atomic.Int64
	lost, wrong, hangs, bad                                                                              atomic.Int64
}

func (s *soak) violation(kind *atomic.Int64, format string, args ...any) {
	kind.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.msgs) < 40 {
		s.msgs = append(s.msgs, time.Now().UTC().Format("15:04:05 ")+fmt.Sprintf(format, args...))
	}
}

// rpcErr sorts an RPC error: expected while its peer is being killed, a
// hang when it is the deadline, else a failure.
func (s *soak) rpcErr(pr *peer, what string, err error) {
	switch {
	case pr.down.Load():
		s.c.interrupted.Add(1)
	case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		s.violation(&s.c.hangs, "%s on %s outlived its %v deadline: %v", what, pr.name, opTimeout, err)
	default:
		s.violation(&s.c.bad, "%s on %s: %v", what, pr.name, err)
	}
}

// session is an engine session of a worker on one generation of its peer.
type session struct {
	conn  *grpc.ClientConn
	e     *engineclient.Engine
	admin pb.AdminServiceClient
	gen   int64
	stop  context.CancelFunc
}

func (se *session) close() {
	if se == nil {
		return
	}
	se.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	se.e.Close(ctx)
	cancel()
	se.conn.Close()
}

func openSession(p *proc, shm *engineclient.Shm, gen int64) (*session, error) {
	conn, err := engineclient.Dial(p.socket)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	e, err := engineclient.Open(ctx, conn, flash.OpenRequest(model, shm.Path))
	if err != nil {
		conn.Close()
		return nil, err
	}
	kctx, stop := context.WithCancel(context.Background())
	go e.KeepAlive(kctx, 2*time.Second)
	return &session{conn: conn, e: e, admin: pb.NewAdminServiceClient(conn), gen: gen, stop: stop}, nil
}

// worker runs random operations on its keys (and, in the cluster, loads of
// the other peers' keys) until stop is closed.
func (s *soak) worker(stop <-chan struct{}, pr *peer, w int, remote [][]byte) {
	defer s.wg.Done()
	shm, err := engineclient.CreateShm(filepath.Join(s.shmDir, fmt.Sprintf("%s-w%d", pr.name, w)), flash.Size())
	if err != nil {
		s.violation(&s.c.bad, "shm: %v", err)
		return
	}
	defer shm.Close()
	rng := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	var se *session
	defer func() { se.close() }()
	for {
		select {
		case <-stop:
			return
		default:
		}
		pr.gate.RLock()
		if se == nil || se.gen != pr.gen.Load() {
			se.close()
			se = nil
			if se, err = openSession(pr.p.Load(), shm, pr.gen.Load()); err != nil {
				s.rpcErr(pr, "OpenSession", err)
				pr.gate.RUnlock()
				time.Sleep(100 * time.Millisecond)
				continue
			}
		}
		if !s.op(pr, se, shm, rng, pr.keys[w], remote) {
			se.close()
			se = nil
		}
		pr.gate.RUnlock()
		time.Sleep(2 * time.Millisecond)
	}
}

// op runs one random operation; false when the RPC failed.
func (s *soak) op(pr *peer, se *session, shm *engineclient.Shm, rng *mrand.Rand, keys []*key, remote [][]byte) bool {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	k := keys[rng.IntN(len(keys))]
	switch r := rng.IntN(100); {
	case r < 30, r < 45:
		d := pb.Durability_DURABILITY_SSD
		if r >= 30 {
			d = pb.Durability_DURABILITY_DRAM
		}
		put(shm.Mem, 0, content(k.k))
		st, err := se.e.Save(ctx, []*pb.PageRef{{Key: k.k, Blocks: blocksOf(0)}}, d)
		if err != nil {
			s.rpcErr(pr, "Save", err)
			return false
		}
		switch pg := st.Pages[0]; {
		case pg.Code == pb.PageCode_PAGE_OK && d == pb.Durability_DURABILITY_SSD:
			k.mustHave = true
			s.c.savesSSD.Add(1)
		case pg.Code == pb.PageCode_PAGE_OK:
			s.c.savesDRAM.Add(1)
		case pg.Code == pb.PageCode_PAGE_NO_SPACE:
			s.c.refused.Add(1)
		default:
			s.violation(&s.c.bad, "save %x on %s: %v %s", k.k, pr.name, pg.Code, pg.Message)
		}
	case r < 75:
		if len(remote) > 0 && r >= 65 {
			rk := remote[rng.IntN(len(remote))]
			st, err := se.e.Load(ctx, []*pb.PageRef{{Key: rk, Blocks: blocksOf(2)}})
			if err != nil {
				s.rpcErr(pr, "Load (remote)", err)
				return false
			}
			s.c.loadsRemote.Add(1)
			if pg := st.Pages[0]; pg.Code != pb.PageCode_PAGE_OK {
				s.c.remoteMisses.Add(1)
			} else if !bytes.Equal(get(shm.Mem, 2), content(rk)) {
				s.violation(&s.c.wrong, "remote page %x loaded on %s with bytes no save sent (tier %v)", rk, pr.name, pg.Tier)
			}
			return true
		}
		st, err := se.e.Load(ctx, []*pb.PageRef{{Key: k.k, Blocks: blocksOf(1)}})
		if err != nil {
			s.rpcErr(pr, "Load", err)
			return false
		}
		s.c.loads.Add(1)
		switch pg := st.Pages[0]; {
		case pg.Code == pb.PageCode_PAGE_OK:
			if !bytes.Equal(get(shm.Mem, 1), content(k.k)) {
				s.violation(&s.c.wrong, "page %x loaded on %s with bytes no save sent (tier %v)", k.k, pr.name, pg.Tier)
			}
		case refusedLoad(pg.Code):
			s.c.refusedLoads.Add(1)
		case k.mustHave:
			s.violation(&s.c.lost, "acknowledged SSD page %x not served by %s: %v %s", k.k, pr.name, pg.Code, pg.Message)
			k.mustHave = false
		case pg.Code == pb.PageCode_PAGE_NOT_FOUND:
			s.c.notFound.Add(1)
		case pg.Code == pb.PageCode_PAGE_IO_ERROR && strings.Contains(pg.Message, "fetch from"):
			// In the cluster a page this peer evicted may be fetched from
			// a member that cached it: across a partition or a killed
			// member, that fetch fails.
			s.c.fetchFailures.Add(1)
		default:
			s.violation(&s.c.bad, "load %x on %s: %v %s", k.k, pr.name, pg.Code, pg.Message)
		}
	case r < 85:
		chain := make([][]byte, 1+rng.IntN(4))
		for i := range chain {
			chain[i] = keys[rng.IntN(len(keys))].k
		}
		// Short leases: most are released, the others expire (a lease the
		// peer's default 30 s keeps would hold the query budget, half the
		// soak peer's small DRAM, for most of a short run).
		look, err := se.e.C.Lookup(ctx, &pb.LookupRequest{SessionId: se.e.Session, Keys: chain, Lease: true, LeaseMs: 2000})
		if err != nil {
			s.rpcErr(pr, "Lookup", err)
			return false
		}
		s.c.lookups.Add(1)
		if look.LeaseId != "" {
			s.c.leases.Add(1)
			if rng.IntN(4) != 0 { // else it expires
				if _, err := se.e.C.Release(ctx, &pb.ReleaseRequest{SessionId: se.e.Session, LeaseId: look.LeaseId}); err != nil {
					s.rpcErr(pr, "Release", err)
					return false
				}
			}
		}
	default:
		tier := pb.Tier_TIER_DRAM
		if rng.IntN(2) == 0 {
			tier = pb.Tier_TIER_SSD
			k.mustHave = false // even if the answer is lost: the eviction may have happened
		}
		if _, err := se.admin.Evict(ctx, &pb.EvictRequest{Tier: tier, Keys: [][]byte{k.k}}); err != nil {
			s.rpcErr(pr, "Evict", err)
			return false
		}
		s.c.evictions.Add(1)
	}
	return true
}

// refusedLoad: the page could not be read now (no DRAM slot to read it
// into, its deadline passed), not that it is gone.
func refusedLoad(c pb.PageCode) bool {
	return c == pb.PageCode_PAGE_NO_SPACE || c == pb.PageCode_PAGE_DEADLINE
}

// verify loads every page of pr whose SSD save was acknowledged (workers'
// and engine processes'): each must be served with its bytes. The caller
// holds pr.gate exclusively.
func (s *soak) verify(pr *peer, when string) {
	var keys []*key
	for w := range pr.keys {
		for _, k := range pr.keys[w] {
			if k.mustHave {
				keys = append(keys, k)
			}
		}
	}
	for _, k := range pr.child {
		if k.mustHave {
			keys = append(keys, k)
		}
	}
	shm, err := engineclient.CreateShm(filepath.Join(s.shmDir, pr.name+"-verify"), flash.Size())
	if err != nil {
		s.violation(&s.c.bad, "shm: %v", err)
		return
	}
	defer shm.Close()
	se, err := openSession(pr.p.Load(), shm, -1)
	if err != nil {
		s.violation(&s.c.bad, "%s: session for the check %s: %v", pr.name, when, err)
		return
	}
	defer se.close()
	slots := flash.NumBlocks / (flash.PageTokens / flash.BlockTokens)
	// A page refused for room or time is asked for again, up to 40 rounds:
	// at rest, whatever held the DRAM lets go.
	for round := 0; len(keys) > 0; round++ {
		var again []*key
		for i := 0; i < len(keys); i += slots {
			batch := keys[i:min(i+slots, len(keys))]
			refs := make([]*pb.PageRef, len(batch))
			for j, k := range batch {
				refs[j] = &pb.PageRef{Key: k.k, Blocks: blocksOf(j)}
			}
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			st, err := se.e.Load(ctx, refs)
			cancel()
			if err != nil {
				if status.Code(err) == codes.DeadlineExceeded {
					s.violation(&s.c.hangs, "%s: check %s outlived its deadline", pr.name, when)
				} else {
					s.violation(&s.c.bad, "%s: check %s: %v", pr.name, when, err)
				}
				return
			}
			for j, pg := range st.Pages {
				switch {
				case refusedLoad(pg.Code) && round < 40:
					again = append(again, batch[j])
					continue
				case pg.Code != pb.PageCode_PAGE_OK:
					s.violation(&s.c.lost, "%s: acknowledged SSD page %x not served %s: %v %s", pr.name, batch[j].k, when, pg.Code, pg.Message)
					batch[j].mustHave = false
				case !bytes.Equal(get(shm.Mem, j), content(batch[j].k)):
					s.violation(&s.c.wrong, "%s: acknowledged SSD page %x served %s with bytes no save sent", pr.name, batch[j].k, when)
				}
				s.c.checked.Add(1)
			}
		}
		if keys = again; len(keys) > 0 {
			s.c.checkRetries.Add(1)
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// killPeer SIGKILLs pr under its workers' operations, restarts it on the
// same data directory and checks its acknowledged SSD pages.
func (s *soak) killPeer(pr *peer) error {
	pr.down.Store(true)
	pr.p.Load().kill()
	pr.gate.Lock()
	defer pr.gate.Unlock()
	s.c.peerKills.Add(1)
	p, err := startProc(pr.ns, pr.args(), pr.log)
	if err != nil {
		s.violation(&s.c.bad, "%s: restart after SIGKILL: %v", pr.name, err)
		pr.dead.Store(true)
		return err
	}
	s.procs.Store(p, true)
	pr.p.Store(p)
	pr.gen.Add(1)
	s.verify(pr, "after SIGKILL and restart")
	pr.down.Store(false)
	return nil
}

// Engine processes: the test binary again, with childEnv set. Each opens a
// session and runs saves, loads and leasing lookups on its peer's engine
// keys, writing one line per event to stdout, until it is SIGKILLed.
const childEnv = "ORBITKV_SOAK_ENGINE"

func engineChild() int {
	shm, err := engineclient.CreateShm(os.Getenv("ORBITKV_SOAK_SHM"), flash.Size())
	if err != nil {
		fmt.Println("err", err)
		return 2
	}
	conn, err := engineclient.Dial(os.Getenv("ORBITKV_SOAK_SOCKET"))
	if err != nil {
		fmt.Println("err", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	e, err := engineclient.Open(ctx, conn, flash.OpenRequest(model, shm.Path))
	cancel()
	if err != nil {
		fmt.Println("err", err)
		return 2
	}
	space := os.Getenv("ORBITKV_SOAK_SPACE")
	rng := mrand.New(mrand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	fail := func(err error) int {
		if status.Code(err) == codes.DeadlineExceeded {
			fmt.Println("hang", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Println("err", strings.ReplaceAll(err.Error(), "\n", " "))
		}
		return 2
	}
	for {
		i := rng.IntN(childKeys)
		k := keyOf(space, i)
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		switch rng.IntN(4) {
		case 0, 1:
			d := pb.Durability_DURABILITY_SSD
			if rng.IntN(2) == 0 {
				d = pb.Durability_DURABILITY_DRAM
			}
			put(shm.Mem, 0, content(k))
			st, err := e.Save(ctx, []*pb.PageRef{{Key: k, Blocks: blocksOf(0)}}, d)
			if err != nil {
				cancel()
				return fail(err)
			}
			if st.Pages[0].Code == pb.PageCode_PAGE_OK && d == pb.Durability_DURABILITY_SSD {
				fmt.Println("ack", i)
			}
		case 2:
			st, err := e.Load(ctx, []*pb.PageRef{{Key: k, Blocks: blocksOf(1)}})
			if err != nil {
				cancel()
				return fail(err)
			}
			if st.Pages[0].Code == pb.PageCode_PAGE_OK && !bytes.Equal(get(shm.Mem, 1), content(k)) {
				fmt.Println("wrong", i)
			}
		default: // a lease the kill leaves behind: the peer must drop it with the session
			if _, err := e.Lookup(ctx, [][]byte{k, keyOf(space, (i+1)%childKeys)}, true); err != nil {
				cancel()
				return fail(err)
			}
		}
		cancel()
		fmt.Println("op")
	}
}

// engineKill starts an engine process on pr, lets it run a random number
// of operations and SIGKILLs it, in the middle of one as a rule. While pr
// is being killed and restarted, it waits for it.
func (s *soak) engineKill(pr *peer, rng *mrand.Rand) {
	for {
		pr.gate.RLock()
		if !pr.down.Load() {
			break
		}
		pr.gate.RUnlock()
		if pr.dead.Load() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer pr.gate.RUnlock()
	shmPath := filepath.Join(s.shmDir, pr.name+"-engine")
	defer os.Remove(shmPath)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1", "ORBITKV_SOAK_SOCKET="+pr.p.Load().socket,
		"ORBITKV_SOAK_SHM="+shmPath, "ORBITKV_SOAK_SPACE="+pr.name+"/engine")
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.violation(&s.c.bad, "engine process: %v", err)
		return
	}
	if err := cmd.Start(); err != nil {
		s.violation(&s.c.bad, "engine process: %v", err)
		return
	}
	want := 1 + rng.IntN(40)
	progress := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "op":
				s.c.childOps.Add(1)
				if n++; n == want {
					progress <- struct{}{}
				}
			case "ack":
				if i, err := strconv.Atoi(f[1]); err == nil && i < len(pr.child) {
					pr.child[i].mustHave = true
				}
			case "wrong":
				s.violation(&s.c.wrong, "engine process on %s loaded key %s of its space with bytes no save sent", pr.name, f[1])
			case "hang":
				s.violation(&s.c.hangs, "engine process on %s: %s", pr.name, sc.Text())
			case "err":
				if pr.down.Load() {
					s.c.interrupted.Add(1)
				} else {
					s.violation(&s.c.bad, "engine process on %s: %s", pr.name, sc.Text())
				}
			}
		}
	}()
	select {
	case <-progress:
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	case <-done:
	case <-time.After(2 * opTimeout):
		if !pr.down.Load() {
			s.violation(&s.c.hangs, "engine process on %s made %d operations in %v", pr.name, want, 2*opTimeout)
		}
	}
	cmd.Process.Kill()
	<-done
	cmd.Wait()
	s.c.engineKills.Add(1)
}
