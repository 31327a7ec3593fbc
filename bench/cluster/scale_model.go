package cluster

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// scaleModel is fitted to the measured points:
//
//	remote index per peer = perEntry × (hosts−1) × pages
//	gossip per peer       = idle(hosts) + churn × perChange × (hosts−1), idle linear in hosts−1
//	reach (p50, max)      = linear in hosts−1 (a sender sends to each member in turn)
//	lookup p99            = the mean of the points (neither depends on hosts or pages in this design)
type scaleModel struct {
	perEntry         float64
	perFilter        float64 // filters' bytes per remote page (compact)
	idleA, idleB     float64
	perChange        float64
	reachA, reachB   float64
	maxA, maxB       float64
	localP99, remote time.Duration
	again, miss      time.Duration
	missFalse        float64 // false claims asked per miss lookup (mean of the points)
	falseRate        float64 // compact: false claims per confirmation
}

// fitLine returns the least-squares a, b of y = a + b·x (b = 0 when every x
// is the same).
func fitLine(xs, ys []float64) (a, b float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	if d := n*sxx - sx*sx; d > 1e-9 {
		b = (n*sxy - sx*sy) / d
	}
	return (sy - b*sx) / n, b
}

func fitModel(pts []scalePoint) scaleModel {
	var m scaleModel
	var num, den, fnum float64
	var xs, idle, reach, worst []float64
	var local, remote, again time.Duration
	var held, falseClaims float64
	for _, p := range pts {
		e := float64((p.hosts - 1) * p.pages)
		num, den, fnum = num+p.remoteBytes*e, den+e*e, fnum+p.filterBytes*e
		xs = append(xs, float64(p.hosts-1))
		idle, reach, worst = append(idle, p.idleBps), append(reach, p.reachP50.Seconds()), append(worst, p.reachMax.Seconds())
		m.perChange += p.changeBytes / float64(len(pts))
		local, remote, again = local+p.localP99, remote+p.remoteP99, again+p.againP99
		held, falseClaims = held+p.claims[0], falseClaims+p.claims[1]
		m.miss += p.missP99 / time.Duration(len(pts))
		m.missFalse += p.missFalse / float64(len(pts))
	}
	m.perEntry, m.perFilter = num/den, fnum/den
	m.idleA, m.idleB = fitLine(xs, idle)
	m.reachA, m.reachB = fitLine(xs, reach)
	m.maxA, m.maxB = fitLine(xs, worst)
	m.localP99, m.remote, m.again = local/time.Duration(len(pts)), remote/time.Duration(len(pts)), again/time.Duration(len(pts))
	if held+falseClaims > 0 {
		m.falseRate = falseClaims / (held + falseClaims)
	}
	return m
}

// memory is the remote index per peer: the heap fit, or the filters' when
// larger (the heap of a compact index is within the noise of a GC'd heap,
// its filters are counted exactly).
func (m scaleModel) memory(hosts, pages int) float64 {
	return max(m.perEntry, m.perFilter) * float64((hosts-1)*pages)
}
func (m scaleModel) gossip(hosts, churn int) float64 {
	x := float64(hosts - 1)
	return m.idleA + m.idleB*x + float64(churn)*m.perChange*x
}
func (m scaleModel) reach(hosts int) (p50, worst time.Duration) {
	x := float64(hosts - 1)
	return seconds(m.reachA + m.reachB*x), seconds(m.maxA + m.maxB*x)
}

func seconds(s float64) time.Duration { return time.Duration(max(0, s) * float64(time.Second)) }

// printCurve prints every point measured beside the model, then the model
// at cfg's model point against the targets of issue 38.
func printCurve(out io.Writer, cfg ScaleConfig, pts []scalePoint, m scaleModel) {
	fmt.Fprintf(out, "\nmodel: remote index %.2f B/page (filters %.3f); gossip idle %.0f + %.1f B/s per member, %.2f B per change per member; reach p50 %.2f + %.3f ms per member\n",
		m.perEntry, m.perFilter, m.idleA, m.idleB, m.perChange, m.reachA*1e3, m.reachB*1e3)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "hosts\tpages/host\tindex MiB/peer\tmodel\tfilters MiB\tgossip KB/s/peer\tmodel\treach p50 ms\tmodel\treach max ms\tmodel\tlookup p99 local µs\tremote µs\tagain µs\tmiss µs\tclaims held/false\tfalse/miss\t")
	for _, p := range pts {
		p50, worst := m.reach(p.hosts)
		fmt.Fprintf(w, "%d\t%d\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f/%.0f\t%.2f\t\n", p.hosts, p.pages,
			p.remoteBytes/(1<<20), m.memory(p.hosts, p.pages)/(1<<20), p.filterBytes/(1<<20), p.churnBps/1e3, m.gossip(p.hosts, cfg.Churn)/1e3,
			ms(p.reachP50), ms(p50), ms(p.reachMax), ms(worst), us(p.localP99), us(p.remoteP99), us(p.againP99), us(p.missP99), p.claims[0], p.claims[1], p.missFalse)
	}
	w.Flush()
	n, pg, churn := cfg.ModelHosts, cfg.ModelPages, cfg.ModelChurn
	mem, gos := m.memory(n, pg), m.gossip(n, churn)
	p50, worst := m.reach(n)
	fmt.Fprintf(out, "\nmodel at %d hosts × %d pages, churn %d changes/s/host:\n", n, pg, churn)
	fmt.Fprintf(out, "  remote index   %8.1f MiB/peer   (target ≤ 64 MiB: %s); of which filters %.1f MiB\n", mem/(1<<20), verdict(mem <= 64<<20),
		m.perFilter*float64((n-1)*pg)/(1<<20))
	fmt.Fprintf(out, "  gossip         %8.3f MB/s/peer  (target ≤ 1 MB/s: %s)\n", gos/1e6, verdict(gos <= 1e6))
	fmt.Fprintf(out, "  reach all      p50 %v, max %v\n", p50.Round(time.Millisecond), worst.Round(time.Millisecond))
	fmt.Fprintf(out, "  lookup p99     local hit %v, remote extension %v, again %v (mean of the points)\n", m.localP99.Round(time.Microsecond),
		m.remote.Round(time.Microsecond), m.again.Round(time.Microsecond))
	fmt.Fprintf(out, "  lookup p99     of pages nobody holds %v (mean of the points), %.2f false claims asked per such lookup\n", m.miss.Round(time.Microsecond), m.missFalse)
	fmt.Fprintf(out, "  false claims   %.1f%% of confirmations of held chains (each one Holds RPC, never a page)\n", 100*m.falseRate)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }
func us(d time.Duration) float64 { return d.Seconds() * 1e6 }
