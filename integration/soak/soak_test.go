package soak

import (
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// soak is one run: its peers, tallies and samples.
type soak struct {
	t      *testing.T
	dur    time.Duration
	every  time.Duration
	out    string
	base   string // the peers' data directories
	shmDir string
	peers  []*peer
	solo   *peer
	lan    *lan
	c      counts
	mu     sync.Mutex
	msgs   []string
	wg     sync.WaitGroup
	procs  sync.Map // every peer process started: killed at the end
	fault  sync.Mutex
	start  time.Time
	samp   []sample
	how    string // how partitions are made
}

// TestSoak runs the soak for ORBITKV_SOAK (a duration: 1m in make test, 30m
// in make soak). ORBITKV_SOAK_OUT names a directory for samples.csv,
// samples.png and summary.txt (else a temporary one); ORBITKV_SOAK_SAMPLE
// the sampling interval (10 s, or the duration / 30 if that is shorter).
func TestSoak(t *testing.T) {
	v := os.Getenv("ORBITKV_SOAK")
	if v == "" {
		t.Skip("skipped: set ORBITKV_SOAK to a duration (make soak, make test-soak)")
	}
	dur, err := time.ParseDuration(v)
	if err != nil || dur < 30*time.Second {
		t.Fatalf("ORBITKV_SOAK=%q: want a duration of 30s or more", v)
	}
	s := &soak{t: t, dur: dur, every: min(10*time.Second, dur/30), out: os.Getenv("ORBITKV_SOAK_OUT")}
	if e := os.Getenv("ORBITKV_SOAK_SAMPLE"); e != "" {
		if s.every, err = time.ParseDuration(e); err != nil {
			t.Fatal(err)
		}
	}
	if s.out == "" {
		s.out = t.TempDir()
	} else if err := os.MkdirAll(s.out, 0o755); err != nil {
		t.Fatal(err)
	}
	// A watchdog for the whole run: every wait below has its own deadline.
	watchdog := time.AfterFunc(dur+15*time.Minute, func() {
		panic("TestSoak outlived its duration by 15 minutes: some wait has no deadline")
	})
	defer watchdog.Stop()
	s.base = t.TempDir() // first: removed after the processes below are gone
	s.shmDir = filepath.Join(s.base, "shm")
	if err := os.Mkdir(s.shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if d, err := os.MkdirTemp("/dev/shm", "orbitkv-soak-"); err == nil {
		s.shmDir = d
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	t.Cleanup(s.killAll)
	s.startPeers()
	s.run()
	s.finish()
}

// killAll SIGKILLs every peer process the run started that still runs.
func (s *soak) killAll() {
	s.procs.Range(func(p, _ any) bool { p.(*proc).kill(); return true })
}

// startPeers starts the solo peer on loopback and, where namespaces can be
// made, the 3-peer cluster.
func (s *soak) startPeers() {
	t := s.t
	logs := s.out
	s.solo = &peer{name: "solo", metrics: "127.0.0.1:0", dir: filepath.Join(s.base, "solo"), log: filepath.Join(logs, "solo.log")}
	s.peers = append(s.peers, s.solo)
	if why := skipNoNamespaces(); why != "" {
		t.Logf("the 3-peer cluster is left out: %s", why)
	} else {
		s.lan = newLan(t, 3, s.killAll)
		for i, h := range s.lan.hosts {
			name := fmt.Sprintf("host-%c", 'a'+i)
			pr := &peer{name: name, ns: h.ns, metrics: h.addr + ":9464", dir: filepath.Join(s.base, name), log: filepath.Join(logs, name+".log"),
				extra: []string{"--cluster-addr", h.addr + ":7946", "--node-name", name, "--cluster-insecure"}}
			if i > 0 {
				pr.extra = append(pr.extra, "--cluster-join", s.lan.hosts[0].addr+":7946")
			}
			s.peers = append(s.peers, pr)
		}
	}
	for _, pr := range s.peers {
		for w := range pr.keys {
			for i := range keysPerWorker {
				pr.keys[w] = append(pr.keys[w], &key{k: keyOf(fmt.Sprintf("%s/w%d", pr.name, w), i)})
			}
		}
		for i := range childKeys {
			pr.child = append(pr.child, &key{k: keyOf(pr.name+"/engine", i)})
		}
		p, err := startProc(pr.ns, pr.args(), pr.log)
		if err != nil {
			t.Fatalf("%s: %v", pr.name, err)
		}
		s.procs.Store(p, true)
		pr.p.Store(p)
	}
	if s.lan != nil {
		if !s.waitMembers(3, 2*time.Minute) {
			t.Fatal("the cluster did not reach 3 members on every peer in 2 minutes")
		}
	}
}

// waitMembers waits until every cluster peer counts n members.
func (s *soak) waitMembers(n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ok := true
		for _, pr := range s.peers[1:] {
			m, err := scrape(pr.p.Load().metrics)
			if err != nil || m["orbitkv_cluster_members"] != float64(n) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// events is how many of each fault a run of d has: at least 2 peer kills
// (one of the solo peer, one of a cluster member), 3 engine kills and, with
// the cluster, 1 partition, whatever the duration.
func events(d time.Duration) (peerKills, engineKills, partitions int) {
	return max(2, int(d/(150*time.Second))), max(3, int(d/(20*time.Second))), max(1, int(d/(100*time.Second)))
}

// run drives the workload and the faults for the duration.
func (s *soak) run() {
	t := s.t
	stop := make(chan struct{})
	pk, ek, pa := events(s.dur)
	for _, pr := range s.peers {
		var remote [][]byte
		if pr != s.solo {
			for _, o := range s.peers[1:] {
				if o != pr {
					for w := range o.keys {
						for _, k := range o.keys[w] {
							remote = append(remote, k.k)
						}
					}
				}
			}
		}
		for w := range workers {
			s.wg.Add(1)
			go s.worker(stop, pr, w, remote)
		}
	}
	s.start = time.Now()
	end := s.start.Add(s.dur)
	s.t.Logf("%d peers, %d workers each; %d peer kills, %d engine kills and %d partitions over %v, samples every %v",
		len(s.peers), workers, pk, ek, pa, s.dur, s.every)
	var faults sync.WaitGroup
	rng := mrand.New(mrand.NewPCG(34, uint64(time.Now().UnixNano())))
	// at spreads n events over the run, each at a random point of its slot.
	at := func(n, i int, r *mrand.Rand) time.Time {
		slot := s.dur / time.Duration(n+1)
		return s.start.Add(slot*time.Duration(i+1) - slot/4 + time.Duration(r.Int64N(int64(slot/2))))
	}
	// Every event of the schedule happens, however late: the run goes on
	// past its duration until the last one is done (counts, not times).
	sleepUntil := func(when time.Time) bool {
		time.Sleep(time.Until(when))
		return true
	}
	faults.Add(3)
	go func() { // peer kills: the solo peer and the cluster members in turn
		defer faults.Done()
		r := mrand.New(mrand.NewPCG(1, rng.Uint64()))
		for i := range pk {
			if !sleepUntil(at(pk, i, r)) {
				return
			}
			pr := s.solo
			if i%2 == 1 && s.lan != nil {
				pr = s.peers[1+(i/2)%3]
				s.fault.Lock()
			}
			t.Logf("%v: SIGKILL %s", time.Since(s.start).Round(time.Second), pr.name)
			err := s.killPeer(pr)
			if pr != s.solo {
				if err == nil && !s.waitMembers(3, 2*time.Minute) {
					s.violation(&s.c.bad, "the cluster did not re-form within 2 minutes of %s's restart", pr.name)
				}
				s.fault.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // engine processes killed mid-operation, on every peer in turn
		defer faults.Done()
		r := mrand.New(mrand.NewPCG(2, rng.Uint64()))
		for i := range ek {
			if !sleepUntil(at(ek, i, r)) {
				return
			}
			s.engineKill(s.peers[i%len(s.peers)], r)
		}
	}()
	go func() { // partitions between two of the cluster's namespaces
		defer faults.Done()
		if s.lan == nil {
			return
		}
		r := mrand.New(mrand.NewPCG(3, rng.Uint64()))
		hold := min(20*time.Second, s.dur/time.Duration(2*(pa+1)))
		for i := range pa {
			if !sleepUntil(at(pa, i, r)) {
				return
			}
			a, b := s.lan.hosts[i%3], s.lan.hosts[(i+1)%3]
			s.fault.Lock()
			how, heal, err := s.lan.partition(a, b)
			if err != nil {
				s.violation(&s.c.bad, "partition: %v", err)
				s.fault.Unlock()
				return
			}
			s.how = how
			s.c.partitions.Add(1)
			t.Logf("%v: partition %s | %s for %v (%s)", time.Since(s.start).Round(time.Second), a.addr, b.addr, hold, how)
			time.Sleep(hold)
			if err := heal(); err != nil {
				s.violation(&s.c.bad, "healing the partition: %v", err)
			}
			s.fault.Unlock()
		}
	}()
	faultsDone := make(chan struct{})
	go func() { faults.Wait(); close(faultsDone) }()
	// Samples until the end and the last fault.
	tick := time.NewTicker(s.every)
	s.sampleAll()
	for done := false; !done || time.Now().Before(end); {
		<-tick.C
		s.sampleAll()
		select {
		case <-faultsDone:
			done = true
		default:
		}
	}
	tick.Stop()
	close(stop)
	s.wg.Wait()
}

// finish checks every peer once more at rest, stops them cleanly and
// judges the run.
func (s *soak) finish() {
	t := s.t
	for _, pr := range s.peers {
		pr.gate.Lock()
		s.verify(pr, "at the end")
		pr.gate.Unlock()
	}
	s.waitDrained(90 * time.Second)
	for _, pr := range s.peers {
		if err := pr.p.Load().stop(); err != nil {
			s.violation(&s.c.bad, "%s: stop: %v", pr.name, err)
		}
	}
	growth := s.growth()
	if err := s.writeOutputs(growth); err != nil {
		t.Errorf("outputs: %v", err)
	}
	summary, _ := os.ReadFile(filepath.Join(s.out, "summary.txt"))
	t.Logf("\n%s", summary)
	for _, m := range s.msgs {
		t.Errorf("%s", m)
	}
	for _, g := range growth {
		if g.over {
			t.Errorf("growth: %s", g)
		}
	}
	if n := s.c.lost.Load() + s.c.wrong.Load() + s.c.hangs.Load() + s.c.bad.Load(); n > 0 {
		t.Errorf("%d lost, %d wrong, %d hangs, %d other failures", s.c.lost.Load(), s.c.wrong.Load(), s.c.hangs.Load(), s.c.bad.Load())
	}
	// Counts, not times: a run that did not do what it is for fails.
	pk, ek, pa := events(s.dur)
	want := map[string][2]int64{"peer kills": {s.c.peerKills.Load(), int64(pk)}, "engine kills": {s.c.engineKills.Load(), int64(ek)}}
	if s.lan != nil {
		want["partitions"] = [2]int64{s.c.partitions.Load(), int64(pa)}
	}
	for what, n := range want {
		if n[0] < n[1] {
			t.Errorf("%s: %d of %d", what, n[0], n[1])
		}
	}
	if s.c.savesSSD.Load() == 0 || s.c.loads.Load() == 0 || s.c.checked.Load() == 0 || (s.lan != nil && s.c.loadsRemote.Load() == 0) {
		t.Errorf("the workload did not run: %d SSD saves, %d loads, %d remote loads, %d pages checked",
			s.c.savesSSD.Load(), s.c.loads.Load(), s.c.loadsRemote.Load(), s.c.checked.Load())
	}
}

// drainGauges must read 0 on an idle peer (docs/configuration.md), once
// the sessions of killed engine processes have expired.
var drainGauges = []string{"orbitkv_transfer_inflight_copies", "orbitkv_transfer_inflight_ops", "orbitkv_fabric_leases",
	"orbitkv_fabric_query_bytes", "orbitkv_tiers_ssd_inflight", "orbitkv_tiers_unsealed_pages", "orbitkv_fabric_sessions"}

func (s *soak) waitDrained(d time.Duration) {
	deadline := time.Now().Add(d)
	for _, pr := range s.peers {
		for {
			m, err := scrape(pr.p.Load().metrics)
			var busy []string
			for _, g := range drainGauges {
				if err == nil && m[g] != 0 {
					busy = append(busy, fmt.Sprintf("%s %g", g, m[g]))
				}
			}
			if err == nil && len(busy) == 0 {
				break
			}
			if time.Now().After(deadline) {
				s.violation(&s.c.bad, "%s: not idle %v after the workload: %v %s", pr.name, d, err, strings.Join(busy, ", "))
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}
