package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// captureStderr points the usage-on-error output at a buffer for the test.
func captureStderr(t *testing.T) *bytes.Buffer {
	var b bytes.Buffer
	old := stderr
	stderr = &b
	t.Cleanup(func() { stderr = old })
	return &b
}

// TestEveryCommandAnswersHelp: every command and every subcommand of a
// group answers --help with exit status 0; a group lists its subcommands.
func TestEveryCommandAnswersHelp(t *testing.T) {
	captureStderr(t)
	quietFlagUsage(t)
	groups := map[string][]string{"catalog": {"lookup"}, "pki": {"init", "issue"}, "config": {"print"},
		"bench": {"tiers", "saturation", "lookup", "ssd", "fabric", "transfer", "cluster", "gpu", "serving", "report"}}
	for _, c := range commands() {
		var out bytes.Buffer
		err := run(context.Background(), []string{c.name, "--help"}, &out)
		if code := exitCode(err); code != 0 {
			t.Errorf("orbitkv %s --help: exit %d (%v)", c.name, code, err)
		}
		for _, sub := range groups[c.name] {
			if !strings.Contains(out.String(), sub) {
				t.Errorf("orbitkv %s --help does not list %s:\n%s", c.name, sub, out.String())
			}
			err := run(context.Background(), []string{c.name, sub, "--help"}, io.Discard)
			if code := exitCode(err); code != 0 {
				t.Errorf("orbitkv %s %s --help: exit %d (%v)", c.name, sub, code, err)
			}
		}
	}
}

// quietFlagUsage sends what the flag package prints for -h (on os.Stderr)
// to /dev/null for the test, so `make test` output stays readable.
func quietFlagUsage(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = null
	t.Cleanup(func() { os.Stderr = old; null.Close() })
}

// TestBareOrbitkvPrintsHelpAndExits2: no command prints the usage (on
// stderr) and exits 2, as does a group without its subcommand.
func TestBareOrbitkvPrintsHelpAndExits2(t *testing.T) {
	for _, args := range [][]string{nil, {"catalog"}, {"config"}} {
		errOut := captureStderr(t)
		err := run(context.Background(), args, io.Discard)
		if code := exitCode(err); code != 2 || !strings.HasPrefix(errOut.String(), "usage: orbitkv") {
			t.Errorf("orbitkv %v: exit %d (%v), stderr %q", args, code, err, errOut.String())
		}
	}
	quietFlagUsage(t)
	if !errors.Is(run(context.Background(), []string{"serve", "-h"}, io.Discard), flag.ErrHelp) {
		t.Error("serve -h is not help")
	}
}

// startCLIPeer runs a small peer on dir/data and returns its socket.
func startCLIPeer(t *testing.T, dir string) string {
	t.Helper()
	cfg := fabric.DefaultConfig()
	cfg.DataDir, cfg.MetricsAddr, cfg.CUDA = filepath.Join(dir, "data"), "", "off"
	cfg.DRAMBytes, cfg.DRAMSlabBytes, cfg.SSDBytes = 16<<20, 4<<20, 0
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := fabric.New(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return cfg.Socket
}

// statusUntilServing retries status until the peer answers.
func statusUntilServing(t *testing.T, args []string) string {
	t.Helper()
	var out bytes.Buffer
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		out.Reset()
		if err = runStatus(context.Background(), append(args, "--timeout", "2s"), &out); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("status %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// TestStatusFindsTheDataDirsSocketAndPrintsForPeople: with --data-dir (or
// $ORBITKV_SOCKET) status dials the peer from any directory, and prints
// tiers by name and sizes in binary units.
func TestStatusFindsTheDataDirsSocketAndPrintsForPeople(t *testing.T) {
	dir := t.TempDir()
	sock := startCLIPeer(t, dir)
	t.Chdir(t.TempDir()) // not where the peer was started
	out := statusUntilServing(t, []string{"--data-dir", filepath.Join(dir, "data")})
	if !regexp.MustCompile(`\ndram +0 pages +0 B used of 16 MiB +\(0\.0%\)\n`).MatchString(out) || strings.Contains(out, "TIER_") {
		t.Fatalf("status output:\n%s", out)
	}
	t.Setenv("ORBITKV_SOCKET", sock)
	if out := statusUntilServing(t, nil); !strings.HasPrefix(out, "healthy\nversion ") || !strings.Contains(out, "(revision ") {
		t.Fatalf("status over $ORBITKV_SOCKET:\n%s", out)
	}
}

// Computed by integration/python/orbitkv/keys.py (Layout(...).fingerprint(),
// keys.chain) for 50 tokens (i*7919+13) % 151936, i = 0..49: the CLI's keys
// must be the engine adapters' keys byte for byte.
const (
	pyLayout = `{"model":"Qwen/Qwen3-8B","revision":"main","dtype":"bf16","num_layers":36,"kv_heads":8,"head_dim":128,` +
		`"tp_rank":1,"tp_size":2,"page_tokens":16,"byte_layout":"vllm-flash"}`
	pyKeys = "17a4558d89878d0aa3733c1bd947c3b8\n354ce3ff2adbae9c754f1ddadb4e99d6\n71c9261a883d3fe4112a1682ef2557f9\n"
)

func pyTokens() string {
	var ids []string
	for i := 0; i < 50; i++ {
		ids = append(ids, strconv.Itoa((i*7919+13)%151936))
	}
	return strings.Join(ids, ",")
}

// layoutJSON is the session's layout as catalog lookup's --layout takes it.
func layoutJSON(t *testing.T, l *pb.Layout) string {
	b, err := json.Marshal(pagekey.Layout{Model: l.Model, Revision: l.Revision, DType: l.Dtype, NumLayers: l.NumLayers, KVHeads: l.KvHeads,
		HeadDim: l.HeadDim, TPRank: l.TpRank, TPSize: l.TpSize, PageTokens: l.PageTokens, ByteLayout: l.ByteLayout})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustHex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCatalogLookupKeysMatchPython: the keys catalog lookup computes from
// token ids and a layout are the Python adapters'.
func TestCatalogLookupKeysMatchPython(t *testing.T) {
	var out bytes.Buffer
	if err := runCatalogLookup(context.Background(), []string{"--layout", pyLayout, "--tokens", pyTokens(), "--keys-only"}, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != pyKeys {
		t.Fatalf("keys:\n%s\nwant (keys.py):\n%s", out.String(), pyKeys)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--layout", `{"model":"m"}`, "--tokens", "1"}, `field "revision" is missing`},
		{[]string{"--layout", pyLayout, "--tokens", "1,2,x"}, `token 2 "x"`},
		{[]string{"--layout", pyLayout, "--tokens", "1,2,3"}, "3 tokens make no whole page of 16"},
		{[]string{"--tokens", "1,2,3"}, "need --layout"},
	} {
		if err := runCatalogLookup(context.Background(), c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("catalog lookup %v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestCatalogLookupWouldThisPromptHit: an engine saves a prompt's first
// two pages; catalog lookup of the prompt's tokens reports those two, and
// route ranks the peer with its run of two DRAM pages.
func TestCatalogLookupWouldThisPromptHit(t *testing.T) {
	dir := t.TempDir()
	sock := startCLIPeer(t, dir)
	statusUntilServing(t, []string{"--socket", sock})
	conn, err := engineclient.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f := engineclient.Flash{Layers: 2, NumBlocks: 16, BlockTokens: 16, PageTokens: 16, KVHeads: 2, HeadDim: 16, ElemBytes: 4}
	shm, err := engineclient.CreateShm(filepath.Join(dir, "kv"), f.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := f.OpenRequest("m", shm.Path)
	e, err := engineclient.Open(ctx, conn, req)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	layout := layoutJSON(t, req.Layout)
	if err := runCatalogLookup(ctx, []string{"--layout", layout, "--tokens", pyTokens(), "--keys-only"}, &out); err != nil {
		t.Fatal(err)
	}
	keys := strings.Fields(out.String())
	var refs []*pb.PageRef
	for i, k := range keys[:2] {
		refs = append(refs, &pb.PageRef{Key: mustHex(t, k), Blocks: []uint32{uint32(i)}})
	}
	st, err := e.Save(ctx, refs, pb.Durability_DURABILITY_DRAM)
	if err != nil || !st.Done {
		t.Fatalf("save: %v %v", st, err)
	}
	out.Reset()
	if err := runCatalogLookup(ctx, []string{"--socket", sock, "--layout", layout, "--tokens", pyTokens()}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "50 tokens: 3 whole pages of 16 (the last 2 tokens") || !strings.Contains(out.String(), "\nhit 2 of 3 pages\n") ||
		!strings.Contains(out.String(), "   0 "+keys[0]+" dram\n") {
		t.Fatalf("lookup:\n%s", out.String())
	}
	// orbitkv route ranks this standalone peer alone, with its two pages.
	out.Reset()
	if err := runRoute(ctx, []string{"--socket", sock, "--layout", layout, "--tokens", pyTokens()}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "3 pages; 1 hosts hold a leading run\n") || !strings.Contains(out.String(), " 1 (self) ") || !strings.Contains(out.String(), " alive       2 pages  dram:2  confirmed\n") {
		t.Fatalf("route:\n%s", out.String())
	}
	out.Reset()
	if err := runRoute(ctx, []string{"--socket", sock, "--json", keys[0], keys[1], keys[2]}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"prompt_pages": 3`) || !strings.Contains(out.String(), `"tier": "dram"`) {
		t.Fatalf("route --json:\n%s", out.String())
	}
}
