package engineapi

import (
	"context"
	"time"
)

// Reap closes sessions that missed their keepalive and expired leases.
func (p *API) Reap(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.reapOnce(p.now())
		}
	}
}

func (p *API) reapOnce(now time.Time) {
	for _, s := range p.sessions.list() {
		if s.expired(now) {
			p.log.Warn().Str("session", s.id).Str("engine", s.engineID).Msg("session missed its keepalive; closing")
			p.closeSession(s.id)
			continue
		}
		for _, l := range s.takeExpiredLeases(now) {
			p.releaseLease(l)
		}
		s.forgetStaleOps(now)
	}
	p.pages.UpdateGauges()
}

// CloseSessions closes every session: their operations are cancelled and
// waited for, their leases released and their buffers unmapped.
func (p *API) CloseSessions() {
	for _, s := range p.sessions.list() {
		p.closeSession(s.id)
	}
}
