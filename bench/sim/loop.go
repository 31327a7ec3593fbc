package sim

import (
	"container/heap"
	"errors"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// job is one request on its way through a host.
type job struct {
	req       *Request
	keys      []pagekey.Key
	host      int
	arrivalNs int64
	estNs     int64 // the router's estimate of its service time
	endNs     int64 // prefill completion (first token)
	plan      plan
}

// hittable is the part of j's key chain a lookup may hit: an engine always
// computes at least the last prompt token, so at most
// (input_tokens-1)/page_tokens pages, as the connector asks (a fully cached
// page-aligned prompt recomputes its last page). All whole pages are saved.
func (sm *sim) hittable(j *job) []pagekey.Key {
	return j.keys[:min(len(j.keys), (j.req.InputTokens-1)/sm.cfg.PageTokens)]
}

// host is one engine host and its peer.
type host struct {
	store     *store
	running   *job
	queue     []*job // FCFS; queue[head:] are waiting
	head      int
	queuedNs  int64 // sum of the waiting jobs' estimates
	busyNs    int64
	completed int
}

// sim is the state of one run. All times are virtual nanoseconds.
type sim struct {
	cfg    Config
	fp     pagekey.Fingerprint
	hosts  []*host
	fin    finishQueue
	now    int64
	seq    int   // requests routed so far
	loadNs int64 // total time spent loading hit pages
	c      Counters
	ttft   []int64 // by trace order
}

// Run replays reqs (in arrival order, as ParseTrace returns them) on the
// cluster cfg describes and returns what happened. It is deterministic.
func Run(cfg Config, reqs []Request) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sm := &sim{cfg: cfg, fp: cfg.Model.Layout(cfg.PageTokens).Fingerprint(), ttft: make([]int64, len(reqs))}
	for range cfg.Hosts {
		st, err := newStore(cfg, &sm.c)
		if err != nil {
			return nil, err
		}
		sm.hosts = append(sm.hosts, &host{store: st})
	}
	err := sm.loop(reqs)
	for _, h := range sm.hosts {
		err = errors.Join(err, h.store.close())
	}
	if err != nil {
		return nil, err
	}
	return sm.result(reqs), nil
}

// loop processes completions and arrivals in time order; at equal times a
// completion goes first (its pages are saved before the arrival looks up).
func (sm *sim) loop(reqs []Request) error {
	next := 0
	for next < len(reqs) || sm.fin.Len() > 0 {
		if sm.fin.Len() > 0 && (next == len(reqs) || sm.fin[0].endNs <= arrivalNs(&reqs[next])) {
			if err := sm.finish(heap.Pop(&sm.fin).(*job)); err != nil {
				return err
			}
			continue
		}
		sm.arrive(&reqs[next])
		next++
	}
	return nil
}

func arrivalNs(r *Request) int64 { return r.ArrivalMs * 1e6 }

// arrive routes a request and starts it if its host is idle.
func (sm *sim) arrive(r *Request) {
	sm.now = arrivalNs(r)
	j := &job{req: r, keys: PageKeys(sm.fp, sm.cfg.PageTokens, *r), arrivalNs: sm.now}
	views := make([]HostView, len(sm.hosts))
	for i, h := range sm.hosts {
		views[i].AheadNs = h.queuedNs
		if h.running != nil {
			views[i].AheadNs += h.running.endNs - sm.now
		}
		if sm.cfg.Router.needsPrefix() {
			views[i].CachedTokens = int64(sm.localPrefix(i, sm.hittable(j)) * sm.cfg.PageTokens)
		}
	}
	j.host = sm.cfg.Router.Pick(sm.seq, int64(r.InputTokens), views, sm.cfg.Cost)
	sm.seq++
	j.estNs = sm.cfg.Cost.PrefillNs(int64(r.InputTokens) - views[j.host].CachedTokens)
	h := sm.hosts[j.host]
	if h.running == nil {
		sm.start(j)
		return
	}
	h.queue = append(h.queue, j)
	h.queuedNs += j.estNs
}

// start looks a job up on its host, leases its hits and schedules its
// completion after loading the hits and computing the rest.
func (sm *sim) start(j *job) {
	h := sm.hosts[j.host]
	j.plan = sm.lookup(j.host, sm.hittable(j))
	hit := int64(j.plan.hitPages() * sm.cfg.PageTokens)
	miss := int64(j.req.InputTokens) - hit
	load := sm.cfg.Cost.LoadNs(j.plan.load)
	sm.loadNs += load
	dur := load + sm.cfg.Cost.PrefillNs(miss)
	j.endNs = sm.now + dur
	h.running = j
	h.busyNs += dur
	sm.c.add(j.plan, int64(sm.cfg.PageTokens), int64(j.req.InputTokens))
	heap.Push(&sm.fin, j)
}

// restoredFromSSD is the set of pages job j read from its own host's SSD.
func (sm *sim) restoredFromSSD(j *job) map[pagekey.Key]bool {
	out := map[pagekey.Key]bool{}
	for _, l := range j.plan.leases {
		if l.host == j.host && l.tier == catalog.TierSSD {
			out[l.key] = true
		}
	}
	return out
}

// finish ends a job's leases, saves its pages, records its TTFT and starts
// the next job of its host.
func (sm *sim) finish(j *job) error {
	sm.now = j.endNs
	h := sm.hosts[j.host]
	restored := sm.restoredFromSSD(j)
	sm.release(j.plan)
	h.store.now = sm.now
	for _, k := range j.keys {
		if err := h.store.save(k, restored[k]); err != nil {
			return err
		}
	}
	h.store.keepInHBM(j.keys)
	sm.ttft[j.req.Index] = j.endNs - j.arrivalNs
	j.keys, j.plan = nil, plan{}
	h.running = nil
	h.completed++
	if h.head < len(h.queue) {
		next := h.queue[h.head]
		h.queue[h.head] = nil
		h.head++
		h.queuedNs -= next.estNs
		if h.head == len(h.queue) {
			h.queue, h.head = h.queue[:0], 0
		}
		sm.start(next)
	}
	return nil
}

// finishQueue orders running jobs by completion time, then trace order.
type finishQueue []*job

func (q finishQueue) Len() int { return len(q) }
func (q finishQueue) Less(i, j int) bool {
	if q[i].endNs != q[j].endNs {
		return q[i].endNs < q[j].endNs
	}
	return q[i].req.Index < q[j].req.Index
}
func (q finishQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *finishQueue) Push(x any)   { *q = append(*q, x.(*job)) }
func (q *finishQueue) Pop() any {
	old := *q
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return j
}
