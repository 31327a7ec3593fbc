package fabric

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// TestConfigErrorsNameTheFlag: a refused configuration names the flag (the
// config file's key), never a Go field of a lower layer, and is refused by
// New before anything is created or allocated.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	long := "/tmp/" + strings.Repeat("s", 120) + ".sock"
	for _, c := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"ssd below a region", func(c *Config) { c.SSDBytes = 10 << 20 }, "ssd-bytes 10MiB is below one SSD region"},
		{"ssd file not whole regions", func(c *Config) { c.SSDFileBytes = 100 << 20 }, "ssd-file-bytes 100MiB is not a multiple of 64MiB"},
		{"ssd queue depth", func(c *Config) { c.SSDQueueDepth = 5000 }, "ssd-queue-depth 5000"},
		{"slab alignment", func(c *Config) { c.DRAMSlabBytes = 1<<20 + 1 }, "dram-slab-bytes 1048577 is not a multiple of 4096"},
		{"socket past sun_path", func(c *Config) { c.Socket = long }, "longer than the kernel's limit of 107"},
		{"readmission none and every one", func(c *Config) { c.SSDNoReadmit, c.SSDReadmitAll = true, true }, "ssd-no-readmit and ssd-readmit-all contradict"},
		{"default socket past sun_path", func(c *Config) { c.DataDir = filepath.Join(c.DataDir, strings.Repeat("d", 100)) }, "set a shorter socket (or data-dir)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig(filepath.Join(t.TempDir(), "data"))
			c.set(&cfg)
			p, err := New(cfg, zerolog.New(io.Discard))
			if err == nil {
				p.Close()
				t.Fatalf("started, want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "Bytes ") || strings.Contains(err.Error(), "QueueDepth") {
				t.Fatalf("error %q, want one naming the flag: %q", err, c.want)
			}
			if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
				t.Fatalf("the refused start created %s (err %v): it got past validation", cfg.DataDir, err)
			}
		})
	}
}

// TestDefaultSocketIsAbsolute: the default socket is the data dir's
// absolute path, whatever the working directory.
func TestDefaultSocketIsAbsolute(t *testing.T) {
	t.Chdir(t.TempDir())
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs(filepath.Join("data", "orbitkv.sock"))
	if cfg.Socket != want || !filepath.IsAbs(cfg.Socket) {
		t.Fatalf("default socket %q, want %q", cfg.Socket, want)
	}
}

// TestDefaultStartWarnsNothing: a start on the default configuration (here
// with a small pool) logs no warning, and no info line carries an error
// field (an operator's log search for errors finds none on a machine
// without a GPU); the default query budget is half the pool. A budget
// asked above that cap still warns.
func TestDefaultStartWarnsNothing(t *testing.T) {
	for _, c := range []struct {
		name   string
		budget uint64
		warn   bool
	}{{"default", 0, false}, {"within the cap", 1 << 20, false}, {"above the cap", 1 << 30, true}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig(filepath.Join(t.TempDir(), "data"))
			if c.budget != 0 {
				cfg.QueryBudgetBytes = bytesize.Size(c.budget)
			}
			var logs bytes.Buffer
			p, err := New(cfg, zerolog.New(&logs))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got := strings.Contains(logs.String(), `"level":"warn"`); got != c.warn {
				t.Fatalf("warned %v, want %v:\n%s", got, c.warn, logs.String())
			}
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, `"level":"info"`) && strings.Contains(line, `"error":`) {
					t.Errorf("info line with an error field: %s", line)
				}
			}
		})
	}
}

func TestQueryBudget(t *testing.T) {
	for _, c := range []struct {
		asked, pool, want uint64
		capped            bool
	}{{0, 1 << 30, 512 << 20, false}, {256 << 20, 1 << 30, 256 << 20, false}, {2 << 30, 1 << 30, 512 << 20, true}} {
		if got, capped := queryBudget(c.asked, c.pool); got != c.want || capped != c.capped {
			t.Errorf("queryBudget(%d, %d) = %d, %v; want %d, %v", c.asked, c.pool, got, capped, c.want, c.capped)
		}
	}
}
