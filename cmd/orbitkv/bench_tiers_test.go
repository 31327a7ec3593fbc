package main

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

func TestParseMooncakeResult(t *testing.T) {
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
			r, err := parseMooncakeResult([]byte(tc.out+"\n"), 2, 2, 100)
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

// TestBenchTiersMooncake: without Mooncake's environment the table says the
// comparison was skipped and why; with it (scripts/install-mooncake.sh,
// make deps) both placements' rows come out of a real master on loopback.
// ORBITKV_REQUIRE=mooncake makes a missing environment a failure.
func TestBenchTiersMooncake(t *testing.T) {
	b, _, _ := tinyTiersBench(t)
	b.skipSSD, b.mooncakeVenv = true, t.TempDir()
	var out strings.Builder
	if err := b.run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "skipped: no Mooncake environment at "+b.mooncakeVenv) {
		t.Errorf("without an environment, output lacks the skipped row:\n%s", out.String())
	}

	venv := os.Getenv("ORBITKV_MOONCAKE_VENV")
	if venv == "" {
		home, _ := os.UserHomeDir()
		venv = filepath.Join(home, ".cache/orbitkv/mooncake-"+mooncakeVersion)
	}
	if _, err := os.Stat(filepath.Join(venv, "bin", "mooncake_master")); err != nil {
		if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "mooncake") {
			t.Fatalf("ORBITKV_REQUIRE=mooncake but %s has no Mooncake: %v", venv, err)
		}
		t.Skipf("no Mooncake environment at %s (scripts/install-mooncake.sh builds it)", venv)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ = tinyTiersBench(t)
	b.skipSSD, b.mooncakeVenv, b.mooncakeDriver = true, venv, filepath.Join(wd, "../..", mooncakeDriverRel)
	out.Reset()
	if err := b.run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	for _, want := range []string{"save vs Mooncake put", "load vs Mooncake get", "same process, memcpy", "segment in a 2nd process, TCP",
		"batch_put_from_multi_buffers"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
