package serving

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress reports a window's state on a writer: a redrawn bar on a
// terminal, a line every few seconds elsewhere. Its goroutine is owned by
// start/stop.
type progress struct {
	w      io.Writer
	tty    bool
	phase  string
	start  time.Time
	window time.Duration

	done, failed, inflight atomic.Int64

	stopc chan struct{}
	wg    sync.WaitGroup
}

func startProgress(w io.Writer, tty bool, phase string, window time.Duration) *progress {
	p := &progress{w: w, tty: tty, phase: phase, start: time.Now(), window: window, stopc: make(chan struct{})}
	if w == nil {
		return p
	}
	every := 5 * time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stopc:
				p.draw(true)
				return
			case <-t.C:
				p.draw(false)
			}
		}
	}()
	return p
}

func (p *progress) draw(final bool) {
	el := time.Since(p.start)
	frac := min(1, el.Seconds()/p.window.Seconds())
	state := fmt.Sprintf("%s %5.1f/%.0fs done %d failed %d in flight %d", p.phase, el.Seconds(),
		p.window.Seconds(), p.done.Load(), p.failed.Load(), p.inflight.Load())
	if el > p.window && p.inflight.Load() > 0 {
		state += " (draining)"
	}
	if !p.tty {
		fmt.Fprintln(p.w, "bench serving:", state)
		return
	}
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r[%s%s] %s\x1b[K", strings.Repeat("#", n), strings.Repeat(" ", width-n), state)
	if final {
		fmt.Fprintln(p.w)
	}
}

func (p *progress) stop() {
	if p.w == nil {
		return
	}
	close(p.stopc)
	p.wg.Wait()
}
