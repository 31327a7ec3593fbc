package main

import (
	"context"
	"io"
	"os"
	"os/exec"
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
