package tiers

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/internal/engineclient"
)

// tinyTiersBench is bench tiers at a test's size: 16 KiB pages.
func tinyTiersBench(t *testing.T) (*tiersBench, string, string) {
	dir, shm := t.TempDir(), t.TempDir()
	b := &tiersBench{dir: dir, shmDir: shm, pages: 8, batch: 4, rounds: 1, ssdPages: 8, ssdDepth: 2,
		flash: engineclient.Flash{Layers: 2, BlockTokens: 16, PageTokens: 64, KVHeads: 1, HeadDim: 16, ElemBytes: 2}}
	b.flash.NumBlocks = 2 * b.pages * (b.flash.PageTokens / b.flash.BlockTokens)
	if _, err := exec.LookPath("fio"); err != nil {
		b.skipSSD = true
	}
	return b, dir, shm
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestBenchTiersRemovesItsScratch: bench tiers leaves nothing in --dir or
// --shm-dir, after a run and after one that fails (a cancelled context, as
// an interrupt cancels it), and keeps what was there before.
func TestBenchTiersRemovesItsScratch(t *testing.T) {
	b, dir, shm := tinyTiersBench(t)
	if err := os.WriteFile(dir+"/mine", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.run(context.Background(), io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, dir); len(got) != 1 || got[0] != "mine" {
		t.Errorf("--dir after a run holds %v, want only the file that was there", got)
	}
	if got := entries(t, shm); len(got) != 0 {
		t.Errorf("--shm-dir after a run holds %v", got)
	}
	b, dir, shm = tinyTiersBench(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.run(ctx, io.Discard); err == nil {
		t.Fatal("a cancelled run reported success")
	}
	if got := append(entries(t, dir), entries(t, shm)...); len(got) != 0 {
		t.Errorf("after a cancelled run: %v left", got)
	}
}

func TestParsePeerResult(t *testing.T) {
	const ok = `{"version":"v","placement":"local","page_bytes":100,"pages":2,"bytes_checked":400,` +
		`"rounds":[{"put_gbps":1,"get_gbps":2},{"put_gbps":3,"get_gbps":4}]}`
	for _, tc := range []struct {
		name, out string
		wantErr   bool
	}{
		{"every byte checked", ok, false},
		{"fewer bytes checked", strings.Replace(ok, `"bytes_checked":400`, `"bytes_checked":399`, 1), true},
		{"other page size", strings.Replace(ok, `"page_bytes":100`, `"page_bytes":50`, 1), true},
		{"a round missing", strings.Replace(ok, `,{"put_gbps":3,"get_gbps":4}`, ``, 1), true},
		{"not JSON", "Traceback (most recent call last):", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parsePeerResult([]byte(tc.out+"\n"), 2, 2, 100)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if put, get := r.medians(); put != 3 || get != 4 {
				t.Errorf("medians = %v/%v, want 3/4", put, get)
			}
		})
	}
}

// TestBenchTiersPeerSystems: without their environments the table says each
// comparison was skipped and why; with one (scripts/install-mooncake.sh, run
// by make deps; scripts/install-lmcache.sh) its rows come out of its real
// server on loopback. ORBITKV_REQUIRE=mooncake (or lmcache) makes a missing
// environment a failure.
func TestBenchTiersPeerSystems(t *testing.T) {
	b, _, _ := tinyTiersBench(t)
	b.skipSSD, b.mooncakeVenv, b.lmcacheVenv = true, t.TempDir(), t.TempDir()
	var out strings.Builder
	if err := b.run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skipped: no Mooncake environment at " + b.mooncakeVenv, "skipped: no LMCache environment at " + b.lmcacheVenv} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("without environments, output lacks %q:\n%s", want, out.String())
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	home, _ := os.UserHomeDir()
	for _, tc := range []struct {
		name, env, version string
		want               []string
	}{
		{"mooncake", "ORBITKV_MOONCAKE_VENV", MooncakeVersion, []string{"save vs Mooncake put", "load vs Mooncake get",
			"same process, memcpy", "segment in a 2nd process, TCP", "batch_put_from_multi_buffers"}},
		{"lmcache", "ORBITKV_LMCACHE_VENV", LMCacheVersion, []string{"save vs LMCache put", "load vs LMCache get", "lmcache_server, TCP"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			venv := os.Getenv(tc.env)
			if venv == "" {
				venv = filepath.Join(home, ".cache/orbitkv", tc.name+"-"+tc.version)
			}
			if _, err := os.Stat(filepath.Join(venv, ".orbitkv-stamp")); err != nil {
				if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), tc.name) {
					t.Fatalf("ORBITKV_REQUIRE=%s but %s is not built: %v", tc.name, venv, err)
				}
				t.Skipf("no %s environment at %s (scripts/install-%s.sh builds it)", tc.name, venv, tc.name)
			}
			b, _, _ := tinyTiersBench(t)
			b.skipSSD, b.driverDir = true, filepath.Join(wd, "../..", DriverDirRel)
			if tc.name == "mooncake" {
				b.mooncakeVenv = venv
			} else {
				b.lmcacheVenv = venv
			}
			var out strings.Builder
			if err := b.run(context.Background(), &out); err != nil {
				t.Fatal(err)
			}
			t.Log(out.String())
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
