package tiers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
)

// The releases scripts/install-mooncake.sh and scripts/install-lmcache.sh
// pin; their environments are where bench tiers looks by default.
const (
	MooncakeVersion = "0.3.13.post1"
	LMCacheVersion  = "0.5.6"
)

// DriverDirRel is where the peer systems' drivers are, relative to the
// repository root.
const DriverDirRel = "integration/python/orbitkv/bench"

// peerSystem is a KV store bench tiers runs beside OrbitKV: a driver script
// run by the Python of the system's own environment, once per placement.
type peerSystem struct {
	name, venv, driver, install string
	placements                  []peerPlacement
}

type peerPlacement struct{ name, label string }

// peerSystems are the systems of this run; an empty environment path drops one.
func (b *tiersBench) peerSystems() []peerSystem {
	var out []peerSystem
	if b.mooncakeVenv != "" {
		out = append(out, peerSystem{name: "Mooncake", venv: b.mooncakeVenv, driver: "mooncake_driver.py",
			install: "scripts/install-mooncake.sh or make deps", placements: []peerPlacement{
				{"local", "same process, memcpy"}, {"remote", "segment in a 2nd process, TCP"}}})
	}
	if b.lmcacheVenv != "" {
		out = append(out, peerSystem{name: "LMCache", venv: b.lmcacheVenv, driver: "lmcache_driver.py",
			install: "scripts/install-lmcache.sh", placements: []peerPlacement{{"server", "lmcache_server, TCP"}}})
	}
	return out
}

// peerResult is what a driver prints: the rounds' GB/s of one
// placement and how many bytes it compared after the gets.
type peerResult struct {
	Version      string `json:"version"`
	Placement    string `json:"placement"`
	API          string `json:"api"`
	PageBytes    uint64 `json:"page_bytes"`
	Pages        int    `json:"pages"`
	BytesChecked uint64 `json:"bytes_checked"`
	Rounds       []struct {
		Put float64 `json:"put_gbps"`
		Get float64 `json:"get_gbps"`
	} `json:"rounds"`
}

// medians returns the median put and get GB/s of the rounds.
func (r peerResult) medians() (put, get float64) {
	puts, gets := make([]float64, len(r.Rounds)), make([]float64, len(r.Rounds))
	for i, x := range r.Rounds {
		puts[i], gets[i] = x.Put, x.Get
	}
	return benchutil.Median(puts), benchutil.Median(gets)
}

// parsePeerResult decodes the driver's output and checks that it moved
// and compared every byte the run asked for.
func parsePeerResult(out []byte, pages, rounds int, pageBytes uint64) (peerResult, error) {
	var r peerResult
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return r, fmt.Errorf("decode driver output %q: %w", out, err)
	}
	want := uint64(pages) * uint64(rounds) * pageBytes
	switch {
	case r.PageBytes != pageBytes:
		return r, fmt.Errorf("driver pages are %d bytes, want %d", r.PageBytes, pageBytes)
	case len(r.Rounds) != rounds:
		return r, fmt.Errorf("driver ran %d rounds, want %d", len(r.Rounds), rounds)
	case r.BytesChecked != want:
		return r, fmt.Errorf("driver checked %d bytes, want %d", r.BytesChecked, want)
	}
	return r, nil
}

// setup finds the environment's Python and the driver; a non-empty reason
// says why the comparison is skipped. Both install scripts stamp a finished
// environment.
func (p peerSystem) setup(driverDir string) (python, driver, reason string) {
	if _, err := os.Stat(filepath.Join(p.venv, ".orbitkv-stamp")); err != nil {
		return "", "", fmt.Sprintf("no %s environment at %s (%s builds it)", p.name, p.venv, p.install)
	}
	if driverDir == "" {
		driverDir = findDriverDir()
	}
	driver = filepath.Join(driverDir, p.driver)
	if _, err := os.Stat(driver); err != nil {
		return "", "", fmt.Sprintf("driver %s not found (run from the repository or pass --driver-dir)", driver)
	}
	return filepath.Join(p.venv, "bin", "python"), driver, ""
}

// findDriverDir looks for the drivers beside the binary's repository
// (bin/orbitkv → ../integration/...), then under the working directory.
func findDriverDir() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "..", DriverDirRel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return DriverDirRel
}

// runDriver runs a driver for one placement with the run's geometry, page
// count, batch and rounds. The system's own logs go to a file in the
// scratch directory; an error quotes their tail.
func (b *tiersBench) runDriver(ctx context.Context, p peerSystem, python, driver, placement string, pageBytes uint64) (peerResult, error) {
	f := b.flash
	args := []string{driver, "--placement", placement, "--seed", strconv.FormatInt(b.seed, 10),
		"--layers", strconv.Itoa(f.Layers), "--kv-heads", strconv.Itoa(f.KVHeads), "--head-dim", strconv.Itoa(f.HeadDim),
		"--block-tokens", strconv.Itoa(f.BlockTokens), "--page-tokens", strconv.Itoa(f.PageTokens),
		"--elem-bytes", strconv.Itoa(f.ElemBytes), "--pages", strconv.Itoa(b.pages), "--batch", strconv.Itoa(b.batch),
		"--rounds", strconv.Itoa(b.rounds)}
	logPath := filepath.Join(b.scratch, p.name+"-"+placement+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return peerResult{}, fmt.Errorf("create %s log: %w", p.name, err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Stderr = logf
	// SIGTERM lets the driver stop the servers it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return peerResult{}, fmt.Errorf("%s driver (%s): %w; log tail: %s", p.name, placement, err, fileTail(logPath, 800))
	}
	return parsePeerResult(out, b.pages, b.rounds, pageBytes)
}

// fileTail is the last n bytes of a file, for an error message.
func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(bytes.TrimSpace(b))
}

// peerRows runs each placement of a system and writes its table rows beside
// OrbitKV's medians, or one skipped row with the reason; the note, for after
// the table, names the API and lists the rounds.
func (b *tiersBench) peerRows(ctx context.Context, tw io.Writer, p peerSystem, peerSave, peerLoad float64, pageBytes uint64) (note string, err error) {
	python, driver, reason := p.setup(b.driverDir)
	if reason != "" {
		fmt.Fprintf(tw, "vs %s\t-\tskipped: %s\t-\t-\t>= 2\n", p.name, reason)
		return "", nil
	}
	for _, pl := range p.placements {
		r, err := b.runDriver(ctx, p, python, driver, pl.name, pageBytes)
		if err != nil {
			return "", errors.Join(fmt.Errorf("%s baseline", p.name), err)
		}
		if note == "" {
			note = fmt.Sprintf("(%s: %s, seed %d, every byte got back checked; put/get GB/s per round:", p.name, r.API, b.seed)
		}
		note += " " + pl.name
		for _, x := range r.Rounds {
			note += fmt.Sprintf(" %.2f/%.2f", x.Put, x.Get)
		}
		put, get := r.medians()
		fmt.Fprintf(tw, "save vs %s put\t%.2f\t%s %s (%s)\t%.2f\t%.2f\t>= 2\n", p.name, peerSave, p.name, r.Version, pl.label, put, peerSave/put)
		fmt.Fprintf(tw, "load vs %s get\t%.2f\t%s %s (%s)\t%.2f\t%.2f\t>= 2\n", p.name, peerLoad, p.name, r.Version, pl.label, get, peerLoad/get)
	}
	return note + ")", nil
}
