package cluster

import (
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Gossip's log lines are bounded: the gossip port takes UDP packets from
// anyone who reaches it and memberlist logs every one it rejects, so a
// stream of junk would otherwise be a stream of ERROR lines. In each window
// of logEvery, the first logBurst warnings and errors are logged; the rest
// are counted and reported in one summary line when the next window opens,
// and at Stop. What is rejected is counted in
// orbitkv_cluster_bad_messages_total whether it is logged or not.
const (
	logEvery = 10 * time.Second
	logBurst = 10
)

// logLimit is the window the gossip's warnings and errors share; its zero
// value is ready. now is the clock (nil: time.Now; tests move their own).
type logLimit struct {
	now func() time.Time
	mu  struct {
		sync.Mutex
		start              time.Time // the window's first line
		logged, suppressed int       // lines in the window
	}
}

// event returns log's event at level, or nil (zerolog's no-op event) when
// the window's lines are spent. A window that suppressed lines is
// summarized first, when the next one opens.
func (l *logLimit) event(log zerolog.Logger, level zerolog.Level) *zerolog.Event {
	ok, ended := l.take()
	summarize(log, ended)
	if !ok {
		return nil
	}
	return log.WithLevel(level)
}

// take counts a line: whether the window lets it through, and the lines
// the window just ended suppressed (0 when none ended).
func (l *logLimit) take() (ok bool, ended int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if l.mu.start.IsZero() || now.Sub(l.mu.start) >= logEvery {
		ended = l.mu.suppressed
		l.mu.start, l.mu.logged, l.mu.suppressed = now, 0, 0
	}
	if l.mu.logged < logBurst {
		l.mu.logged++
		return true, ended
	}
	l.mu.suppressed++
	return false, ended
}

// flush summarizes the current window's suppressed lines (at Stop).
func (l *logLimit) flush(log zerolog.Logger) {
	l.mu.Lock()
	n := l.mu.suppressed
	l.mu.suppressed = 0
	l.mu.Unlock()
	summarize(log, n)
}

func summarize(log zerolog.Logger, suppressed int) {
	if suppressed == 0 {
		return
	}
	log.Warn().Int("suppressed_lines", suppressed).Int("lines_per_window", logBurst).Dur("window", logEvery).
		Msg("gossip log lines suppressed: orbitkv_cluster_bad_messages_total counts the rejected messages")
}

// errNotMember is what the membership check (auth.go) refuses a node
// with; memberlist logs each refusal, which the check counts and logs
// itself.
var errNotMember = errors.New("membership refused")

// memberlistLog sends memberlist's log lines to zerolog: warnings and
// errors as such, within the cluster's logLimit, the rest at debug. The
// lines that say memberlist dropped a packet or stream from the network
// count as bad messages (bad, called after the line is logged).
type memberlistLog struct {
	log   zerolog.Logger
	limit *logLimit
	bad   func()
}

func (w memberlistLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := zerolog.DebugLevel
	switch {
	case strings.Contains(line, "[ERR]"):
		level = zerolog.ErrorLevel
	case strings.Contains(line, "[WARN]"):
		level = zerolog.WarnLevel
	}
	if strings.Contains(line, errNotMember.Error()) {
		level = zerolog.DebugLevel // counted and logged, rate-limited, by Cluster.refused
	}
	if level == zerolog.DebugLevel {
		w.log.Debug().Str("memberlist", line).Send()
		return len(p), nil
	}
	w.limit.event(w.log, level).Str("memberlist", line).Send()
	if rejects(line) {
		w.bad() // after the line: a test that sees the count sees the line
	}
	return len(p), nil
}

// rejections are the phrases of memberlist's (v0.7, net.go) log lines for
// a packet or stream it dropped as malformed, foreign or not decryptable.
var rejections = []string{
	"Decrypt packet failed", "invalid checksum", "missing message type byte", "not supported",
	"invalid msgType", "Failed to decode", "Failed to decompress", "label", "truncated messages",
	"failed to receive:", "Got ping for unexpected node", "Failed to read remote state",
	"Failed to receive user message",
}

func rejects(line string) bool {
	for _, r := range rejections {
		if strings.Contains(line, r) {
			return true
		}
	}
	return false
}
