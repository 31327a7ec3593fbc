package main

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
)

// mooncakeVersion is the Mooncake release scripts/install-mooncake.sh pins;
// its environment is where bench tiers looks by default.
const mooncakeVersion = "0.3.13.post1"

// mooncakeDriverRel is the driver script, relative to the repository root.
const mooncakeDriverRel = "integration/python/orbitkv/bench/mooncake_driver.py"

// mooncakeResult is what the driver prints: the rounds' GB/s of one
// placement and how many bytes it compared after the gets.
type mooncakeResult struct {
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
func (r mooncakeResult) medians() (put, get float64) {
	puts, gets := make([]float64, len(r.Rounds)), make([]float64, len(r.Rounds))
	for i, x := range r.Rounds {
		puts[i], gets[i] = x.Put, x.Get
	}
	return median(puts), median(gets)
}

// parseMooncakeResult decodes the driver's output and checks that it moved
// and compared every byte the run asked for.
func parseMooncakeResult(out []byte, pages, rounds int, pageBytes uint64) (mooncakeResult, error) {
	var r mooncakeResult
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return r, fmt.Errorf("decode mooncake driver output %q: %w", out, err)
	}
	want := uint64(pages) * uint64(rounds) * pageBytes
	switch {
	case r.PageBytes != pageBytes:
		return r, fmt.Errorf("mooncake driver pages are %d bytes, want %d", r.PageBytes, pageBytes)
	case len(r.Rounds) != rounds:
		return r, fmt.Errorf("mooncake driver ran %d rounds, want %d", len(r.Rounds), rounds)
	case r.BytesChecked != want:
		return r, fmt.Errorf("mooncake driver checked %d bytes, want %d", r.BytesChecked, want)
	}
	return r, nil
}

// mooncakeSetup finds the environment's Python and the driver; a non-empty
// reason says why the comparison is skipped.
func (b *tiersBench) mooncakeSetup() (python, driver, reason string) {
	python = filepath.Join(b.mooncakeVenv, "bin", "python")
	if _, err := os.Stat(filepath.Join(b.mooncakeVenv, "bin", "mooncake_master")); err != nil {
		return "", "", fmt.Sprintf("no Mooncake environment at %s (scripts/install-mooncake.sh or make deps builds it)", b.mooncakeVenv)
	}
	driver = b.mooncakeDriver
	if driver == "" {
		driver = findMooncakeDriver()
	}
	if _, err := os.Stat(driver); err != nil {
		return "", "", fmt.Sprintf("driver %q not found (run from the repository or pass --mooncake-driver)", driver)
	}
	return python, driver, ""
}

// findMooncakeDriver looks for the driver beside the binary's repository
// (bin/orbitkv → ../integration/...), then under the working directory.
func findMooncakeDriver() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "..", mooncakeDriverRel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return mooncakeDriverRel
}

// mooncakeRun runs the driver for one placement with the run's geometry,
// page count, batch and rounds. Mooncake's own logs go to a file in the
// scratch directory; an error quotes their tail.
func (b *tiersBench) mooncakeRun(ctx context.Context, python, driver, placement string, pageBytes uint64) (mooncakeResult, error) {
	f := b.flash
	args := []string{driver, "--placement", placement, "--seed", strconv.FormatInt(b.seed, 10),
		"--layers", strconv.Itoa(f.Layers), "--kv-heads", strconv.Itoa(f.KVHeads), "--head-dim", strconv.Itoa(f.HeadDim),
		"--block-tokens", strconv.Itoa(f.BlockTokens), "--page-tokens", strconv.Itoa(f.PageTokens),
		"--elem-bytes", strconv.Itoa(f.ElemBytes), "--pages", strconv.Itoa(b.pages), "--batch", strconv.Itoa(b.batch),
		"--rounds", strconv.Itoa(b.rounds)}
	logPath := filepath.Join(b.scratch, "mooncake-"+placement+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return mooncakeResult{}, fmt.Errorf("create mooncake log: %w", err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Stderr = logf
	// SIGTERM lets the driver stop its master and segment holder.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return mooncakeResult{}, fmt.Errorf("mooncake driver (%s): %w; log tail: %s", placement, err, fileTail(logPath, 800))
	}
	return parseMooncakeResult(out, b.pages, b.rounds, pageBytes)
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

// mooncakeRows runs both placements and writes their table rows beside
// OrbitKV's medians, or one skipped row with the reason; the note, for
// after the table, names the API and lists the rounds.
func (b *tiersBench) mooncakeRows(ctx context.Context, tw io.Writer, peerSave, peerLoad float64, pageBytes uint64) (note string, err error) {
	python, driver, reason := b.mooncakeSetup()
	if reason != "" {
		fmt.Fprintf(tw, "vs Mooncake Store\t-\tskipped: %s\t-\t-\t>= 2\n", reason)
		return "", nil
	}
	for _, pl := range []struct{ name, label string }{
		{"local", "same process, memcpy"},
		{"remote", "segment in a 2nd process, TCP"},
	} {
		r, err := b.mooncakeRun(ctx, python, driver, pl.name, pageBytes)
		if err != nil {
			return "", errors.Join(errors.New("mooncake store baseline"), err)
		}
		if note == "" {
			note = fmt.Sprintf("(Mooncake Store: %s, zero-copy from the registered engine buffer, seed %d, every byte got back checked; put/get GB/s per round:", r.API, b.seed)
		}
		note += " " + pl.name
		for _, x := range r.Rounds {
			note += fmt.Sprintf(" %.2f/%.2f", x.Put, x.Get)
		}
		put, get := r.medians()
		fmt.Fprintf(tw, "save vs Mooncake put\t%.2f\tMooncake %s (%s)\t%.2f\t%.2f\t>= 2\n", peerSave, r.Version, pl.label, put, peerSave/put)
		fmt.Fprintf(tw, "load vs Mooncake get\t%.2f\tMooncake %s (%s)\t%.2f\t%.2f\t>= 2\n", peerLoad, r.Version, pl.label, get, peerLoad/get)
	}
	return note + ")", nil
}
