package fabric

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// TestSecondPeerOnDataDirRefused: a second peer on a live peer's data dir is
// refused at once, naming the holder's pid, and leaves the live catalog
// where it is (before the lock, the second start took Pebble's lock failure
// for a damaged catalog, moved the live one aside and served). Once the
// first peer stops, the data dir starts again.
func TestSecondPeerOnDataDirRefused(t *testing.T) {
	for _, ssdBytes := range []uint64{0, 128 << 20} {
		t.Run(fmt.Sprintf("ssd=%d", ssdBytes), func(t *testing.T) {
			dir := t.TempDir()
			cfg := smallConfig(filepath.Join(dir, "data"))
			cfg.SSDBytes = bytesize.Size(ssdBytes)
			first := startPeer(t, cfg)

			second := cfg
			second.Socket = filepath.Join(dir, "second.sock")
			start := time.Now()
			p, err := New(second, zerolog.New(io.Discard))
			if err == nil {
				p.Close()
				t.Fatal("second peer on the same data dir started")
			}
			want := fmt.Sprintf("data dir %s is in use by pid %d", cfg.DataDir, os.Getpid())
			if !errors.Is(err, ErrDataDirInUse) || !strings.Contains(err.Error(), want) {
				t.Fatalf("second start: %v, want %q", err, want)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("refused after %v, want at once", d)
			}
			moved, _ := filepath.Glob(filepath.Join(cfg.DataDir, "catalog", "corrupt-*"))
			if len(moved) != 0 {
				t.Fatalf("the refused start moved the live catalog aside: %v", moved)
			}
			first.shutdown()
			again := startPeer(t, second)
			again.shutdown()
		})
	}
}
