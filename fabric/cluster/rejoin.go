package cluster

import (
	"context"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Rejoining failed members. memberlist gossips to a member it declared
// dead for GossipToTheDeadTime (30 s on a LAN) and then never contacts it
// again, and the failed member, cut off too, has declared everyone else
// dead: after a partition longer than that the two sides stay apart for
// good, each serving without the other's pages. So each peer keeps the
// gossip addresses of members that went down and tries to join them again,
// with backoff, until they are back or rejoinFor has passed. memberlist's
// leave callback does not say whether a member failed or left (Node.State
// is not set there); a member that left was shut down, so its address
// refuses the probe, and one restarted there would have joined anyway. A
// join is tried only after a short TCP dial answered, so an unreachable
// member costs a dial timeout, not memberlist's TCP timeout.

const (
	rejoinFirst = time.Second      // first retry after a failure, then doubling
	rejoinMax   = 15 * time.Second // longest wait between retries
	rejoinFor   = time.Hour        // a member failed this long is given up (a restarted peer joins by itself)
	rejoinDial  = time.Second      // the reachability probe before a join
)

// rejoinSet decides which failed members to try when; pure (time passed in),
// guarded by its owner.
type rejoinSet struct {
	members map[string]*rejoinEntry
}

type rejoinEntry struct {
	addr        string
	since, next time.Time
	wait        time.Duration
}

// failed records a member memberlist declared failed at now.
func (r *rejoinSet) failed(name, addr string, now time.Time) {
	if addr == "" {
		return
	}
	if r.members == nil {
		r.members = map[string]*rejoinEntry{}
	}
	r.members[name] = &rejoinEntry{addr: addr, since: now, next: now.Add(rejoinFirst), wait: rejoinFirst}
}

// up forgets a member that is alive again (or left for good).
func (r *rejoinSet) up(name string) { delete(r.members, name) }

// due returns the addresses to try at now, in order, and schedules each
// one's next try; members failed longer than rejoinFor are dropped.
func (r *rejoinSet) due(now time.Time) []string {
	var out []string
	for name, e := range r.members {
		if now.Sub(e.since) >= rejoinFor {
			delete(r.members, name)
			continue
		}
		if now.Before(e.next) {
			continue
		}
		out = append(out, e.addr)
		e.wait = min(2*e.wait, rejoinMax)
		e.next = now.Add(e.wait)
	}
	sort.Strings(out)
	return out
}

// rejoiner is the cluster's rejoinSet behind its lock.
type rejoiner struct {
	mu  sync.Mutex
	set rejoinSet
}

// memberDown is told about every member memberlist reports gone.
func (r *rejoiner) memberDown(name, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set.failed(name, addr, time.Now())
}

func (r *rejoiner) memberUp(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set.up(name)
}

func (r *rejoiner) due(now time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.set.due(now)
}

// run tries the due failed members every rejoinFirst until ctx ends,
// joining them through join (memberlist's Join).
func (r *rejoiner) run(ctx context.Context, join func([]string) (int, error), log zerolog.Logger) {
	t := time.NewTicker(rejoinFirst)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, addr := range r.due(now) {
				if ctx.Err() != nil {
					return
				}
				tryRejoin(addr, join, log)
			}
		}
	}
}

func tryRejoin(addr string, join func([]string) (int, error), log zerolog.Logger) {
	conn, err := net.DialTimeout("tcp", addr, rejoinDial)
	if err != nil {
		return // still unreachable
	}
	conn.Close()
	if n, err := join([]string{addr}); n > 0 {
		log.Info().Str("member", addr).Msg("rejoined a failed member")
	} else {
		log.Debug().Err(err).Str("member", addr).Msg("rejoin")
	}
}
