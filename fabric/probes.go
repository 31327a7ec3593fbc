package fabric

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Probes on the metrics listener, for a process supervisor or a kubelet:
// /healthz answers 200 while the process serves HTTP at all (liveness: a
// restart helps only a process that stopped answering), /readyz 200 only
// while the peer can serve engines (readiness), else 503 with the reasons,
// one per line.
func (p *Peer) handleProbes(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if reasons := p.notReady(); len(reasons) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n%s\n", strings.Join(reasons, "\n"))
			return
		}
		fmt.Fprintln(w, "ready")
	})
}

// notReady lists why engines cannot be served now: Run has not started
// serving, the catalog cannot persist, a configured tier is not open, or
// the engine socket does not accept a connection.
func (p *Peer) notReady() []string {
	var reasons []string
	select {
	case <-p.ready:
	default:
		return []string{"starting"}
	}
	if p.pool == nil {
		reasons = append(reasons, "dram tier: not open")
	}
	if p.cfg.SSDBytes > 0 && p.ssd == nil {
		reasons = append(reasons, "ssd tier: not open")
	}
	if problem := p.catalogProblem(); problem != "" {
		reasons = append(reasons, problem)
	}
	c, err := net.DialTimeout("unix", p.cfg.Socket, time.Second)
	if err != nil {
		return append(reasons, fmt.Sprintf("socket %s: %v", p.cfg.Socket, err))
	}
	c.Close()
	return reasons
}
