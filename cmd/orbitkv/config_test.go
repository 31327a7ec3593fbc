package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/internal/bytesize"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "orbitkv.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigFileAndFlags: the file sets what it names, flags override it,
// the rest keeps its default, and each value says where it came from.
func TestConfigFileAndFlags(t *testing.T) {
	file := writeFile(t, "# a peer\ndram-bytes: 2GiB\nssd-bytes: 8GB\nmetrics-addr: \"\"\nlease-ttl: 1m\ncuda: off\n")
	s, err := loadServeSettings("serve", []string{"--config", file, "--dram-bytes", "3GiB"})
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.DRAMBytes != 3<<30 || c.SSDBytes != bytesize.Size(8e9) || c.MetricsAddr != "" || c.CUDA != "off" || c.LeaseTTL.String() != "1m0s" || c.MaxPages != 4096 {
		t.Fatalf("effective config %+v", c)
	}
	for key, want := range map[string]string{"dram-bytes": "flag", "ssd-bytes": "file " + file + ":3", "cuda": "file " + file + ":6", "max-pages": "default"} {
		if got := s.source(s.fs.Lookup(key)); got != want {
			t.Errorf("source of %s = %q, want %q", key, got, want)
		}
	}
}

// TestConfigFileErrors: a bad file names the file, the line and the key.
func TestConfigFileErrors(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"unknown key", "dram-bytes: 1GiB\ndram_bytes: 2GiB\n", `:2: unknown key "dram_bytes"`},
		{"go field name", "DRAMBytes: 1GiB\n", `:1: unknown key "DRAMBytes"`},
		{"bad size", "ssd-bytes: 4 gigs\n", `:1: key "ssd-bytes": byte size "4 gigs"`},
		{"bad duration", "keepalive: soon\n", `:1: key "keepalive"`},
		{"nested", "dram-bytes:\n  size: 1GiB\n", `:1: key "dram-bytes" wants a single value`},
		{"repeated", "cuda: off\ncuda: auto\n", `:2: key "cuda" repeats the one at`},
		{"not a mapping", "- dram-bytes\n", "want a mapping"},
		{"config in config", "config: other.yaml\n", `key "config" is for the command line only`},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeFile(t, c.text)
			_, err := loadServeSettings("serve", []string{"--config", file})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), file) {
				t.Fatalf("error %v, want one naming %s and %q", err, file, c.want)
			}
		})
	}
}

// TestServeRefusesStrayArguments: a positional argument (a forgotten flag
// name, a value without its flag) is refused instead of ignored.
func TestServeRefusesStrayArguments(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a start that got through would stop at once
	for _, args := range [][]string{
		{"--data-dir", dir, "--metrics-addr", "", "--dram-bytes", "16MiB", "--dram-slab-bytes", "4MiB", "--ssd-bytes", "0", "--cuda", "off", "2GiB"},
		{"--data-dir", dir, "--metrics-addr", "", "--dram-bytes", "16MiB", "--dram-slab-bytes", "4MiB", "--ssd-bytes", "0", "--cuda", "off", "serve"},
	} {
		err := runServe(ctx, args, nil)
		stray := args[len(args)-1]
		if err == nil || !strings.Contains(err.Error(), `argument "`+stray+`"`) {
			t.Errorf("serve %v: %v, want the stray argument %q refused", args, err, stray)
		}
	}
}

// TestConfigPrintRoundTrips: `orbitkv config print` shows every key with
// its source, and its output, read back as a config file, gives the same
// configuration.
func TestConfigPrintRoundTrips(t *testing.T) {
	file := writeFile(t, "ssd-bytes: 0\nnode-name: \"a b: c\"\n")
	args := []string{"--config", file, "--data-dir", "/var/tmp/okv", "--dram-bytes", "1536MiB"}
	var out bytes.Buffer
	if err := runConfigPrint(context.Background(), args, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dram-bytes: 1536MiB  # flag\n", "ssd-bytes: 0  # file " + file + ":1\n",
		"socket: /var/tmp/okv/orbitkv.sock  # derived\n", "lease-ttl: 30s  # default\n", `node-name: "a b: c"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config print lacks %q:\n%s", want, out.String())
		}
	}
	again, err := loadServeSettings("serve", []string{"--config", writeFile(t, out.String())})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	first, _ := loadServeSettings("serve", args)
	if err := first.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if a, b := first.effective(false), again.effective(false); a != b {
		t.Fatalf("round trip changed the config:\n%s\nvs\n%s", a, b)
	}
}

// TestConfigPrintRefusesAnInvalidConfig: the configuration is printed, and
// what refuses it is named by its key.
func TestConfigPrintRefusesAnInvalidConfig(t *testing.T) {
	var out bytes.Buffer
	err := runConfigPrint(context.Background(), []string{"--ssd-bytes", "1MiB"}, &out)
	if err == nil || !strings.Contains(err.Error(), "ssd-bytes 1MiB is below one SSD region") || !strings.Contains(out.String(), "ssd-bytes: 1MiB  # flag") {
		t.Fatalf("err %v\n%s", err, out.String())
	}
}
