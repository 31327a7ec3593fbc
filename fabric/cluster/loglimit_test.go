package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	ibv "github.com/orbitkv/orbitkv/rdma"
)

// lockedBuffer is a log sink the test reads while the member writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// gossipLines counts the log's junk lines (memberlist's warnings and
// errors, dropped gossip messages) and its summaries, with the last
// summary's suppressed count.
func (b *lockedBuffer) gossipLines(t *testing.T) (junk, summaries, suppressed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		var l struct {
			Level, Message, Memberlist string
			Suppressed                 int `json:"suppressed_lines"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		switch {
		case strings.HasPrefix(l.Message, "gossip log lines suppressed"):
			summaries, suppressed = summaries+1, l.Suppressed
		case l.Level != "warn" && l.Level != "error":
		case l.Memberlist != "" || l.Message == "gossip message dropped":
			junk++
		}
	}
	return junk, summaries, suppressed
}

// junkPackets are datagrams memberlist (or, for a user message, the
// cluster) rejects, one log line each: an unknown message type, a bad
// CRC, a truncated ping, an empty label, a truncated compressed message,
// a user message that is no gossip message. With a gossip key all but the
// label fail to decrypt.
func junkPackets(t *testing.T) [][]byte {
	noise := make([]byte, 40)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	crc := []byte{12, 0, 0, 0, 0} // hasCrcMsg, then a CRC that is not the payload's
	binary.BigEndian.PutUint32(crc[1:], crc32.ChecksumIEEE(noise)+1)
	return [][]byte{append([]byte{200}, noise...), append(crc, noise...), {0}, {244, 0}, {9}, append([]byte{8, 'Z'}, noise...)}
}

// TestJunkGossipLogIsBounded (issue 34, finding 2): 2,000 junk datagrams
// to a member's gossip port are each counted in
// orbitkv_cluster_bad_messages_total, but log at most logBurst lines in a
// window; the next window opens with one line saying how many were
// suppressed. The member's clock does not move unless the test moves it,
// so the bounds are counts. Before the fix every datagram logged an
// ERROR or WARN line and the counter did not move.
func TestJunkGossipLogIsBounded(t *testing.T) {
	for _, encrypted := range []bool{false, true} {
		t.Run(map[bool]string{false: "clear", true: "encrypted"}[encrypted], func(t *testing.T) {
			var logs lockedBuffer
			c, clock, stop := startJunkMember(t, encrypted, &logs)
			defer stop()
			conn, err := net.Dial("udp", loopbackGossip(t, c))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			junk := junkPackets(t)
			const total, batch = 2000, 100
			for sent := 0; sent < total; {
				for i := 0; i < batch; i++ {
					if _, err := conn.Write(junk[sent%len(junk)]); err != nil {
						t.Fatal(err)
					}
					sent++
				}
				waitCount(t, c, sent) // a batch at a time: the socket buffer never drops one
			}
			if n, summaries, _ := logs.gossipLines(t); n != logBurst || summaries != 0 {
				t.Fatalf("%d junk datagrams logged %d lines and %d summaries, want %d and 0", total, n, summaries, logBurst)
			}

			clock.Add(int64(logEvery))
			if _, err := conn.Write(junk[0]); err != nil {
				t.Fatal(err)
			}
			waitCount(t, c, total+1)
			n, summaries, suppressed := logs.gossipLines(t)
			if n != logBurst+1 || summaries != 1 || suppressed != total-logBurst {
				t.Fatalf("next window: %d lines, %d summaries suppressing %d; want %d, 1, %d",
					n, summaries, suppressed, logBurst+1, total-logBurst)
			}
			if got := counterValue(t, c.m.badMessages); got != total+1 {
				t.Fatalf("bad messages %v, want %d (each datagram once)", got, total+1)
			}
		})
	}
}

// startJunkMember starts a one-member cluster on 127.0.0.1 logging JSON to
// logs, with a clock that moves only when the test adds to it.
func startJunkMember(t *testing.T, encrypted bool, logs *lockedBuffer) (*Cluster, *atomic.Int64, func()) {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{ClusterAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0", NodeName: "junk-target",
		ClusterInsecure: true, RDMA: ibv.Config{Off: true}}
	if encrypted {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			t.Fatal(err)
		}
		cfg.ClusterKeyFile = filepath.Join(dir, "gossip.key")
		if err := os.WriteFile(cfg.ClusterKeyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(cfg, dir, prometheus.NewRegistry(), zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	clock := new(atomic.Int64)
	clock.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c.logLimit.now = func() time.Time { return time.Unix(0, clock.Load()) }
	cat, err := catalog.Open(catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := c.Start(context.Background(), cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, clock, stop
}

// loopbackGossip is the member's gossip port on 127.0.0.1.
func loopbackGossip(t *testing.T, c *Cluster) string {
	t.Helper()
	_, port, err := net.SplitHostPort(c.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// waitCount waits, with a deadline, until the member counted n bad messages.
func waitCount(t *testing.T, c *Cluster, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for counterValue(t, c.m.badMessages) < float64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("bad messages %v, want %d within 20s", counterValue(t, c.m.badMessages), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
