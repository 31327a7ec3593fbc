package serving

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// File names of a run directory.
const (
	ManifestFile = "manifest.json"
	RequestsFile = "requests.jsonl"
	PrefixesFile = "prefixes.jsonl"
	MetricsFile  = "metrics.json"
	DrainFile    = "drain.json"
	SummaryFile  = "summary.json"
)

// Row is one line of requests.jsonl.
type Row struct {
	Index            int       `json:"index"`
	Phase            string    `json:"phase,omitempty"` // probes only
	PrefixID         int       `json:"prefix_id"`       // -1: not a prepared prefix
	Reuse            bool      `json:"reuse"`
	PromptTokens     int       `json:"prompt_tokens"`
	MaxTokens        int       `json:"max_tokens"`
	OutputText       string    `json:"output_text"`
	OutputChunks     int       `json:"output_chunks"`
	CompletionTokens int       `json:"completion_tokens"`  // server usage; 0 if not sent
	CachedTokens     int       `json:"cached_tokens"`      // server usage: prompt tokens not computed
	RestoredTokens   int       `json:"restored_tokens"`    // server usage (reference engine)
	StartS           float64   `json:"start_s"`            // from the window start
	QueueMS          float64   `json:"queue_ms,omitempty"` // trace: start − scheduled arrival
	TTFTMS           float64   `json:"ttft_ms"`
	ITLMS            []float64 `json:"itl_ms"`
	LatencyMS        float64   `json:"latency_ms"`
	Error            string    `json:"error,omitempty"`
	MatchReference   *bool     `json:"match_reference,omitempty"` // nil: no reference to compare
}

// IsDeterministic is whether the run claims that every reused prompt's
// output equals its serial reference (true unless labelled otherwise).
func (m Manifest) IsDeterministic() bool { return m.Deterministic == nil || *m.Deterministic }

// Host describes the machine the driver ran on.
type Host struct {
	Hostname  string `json:"hostname"`
	GOOS      string `json:"goos"`
	GOARCH    string `json:"goarch"`
	CPUs      int    `json:"cpus"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
}

// Manifest is manifest.json: what was run, where and when.
type Manifest struct {
	RunID         string            `json:"run_id"`
	Command       []string          `json:"command"`
	Version       string            `json:"version"`
	GitRevision   string            `json:"git_revision"`
	GitDirty      bool              `json:"git_dirty"`
	Endpoint      string            `json:"endpoint"`
	Model         string            `json:"model"`
	PeerMetrics   string            `json:"peer_metrics,omitempty"`
	EngineMetrics string            `json:"engine_metrics,omitempty"`
	Workload      string            `json:"workload"`
	Labels        map[string]string `json:"labels"`
	// Deterministic is false when the run was labelled non-deterministic
	// (bench serving --deterministic=false: the engine is not batch
	// invariant, so reused prompts may differ from their references); nil in
	// manifests written before the field, which bench report reads as true.
	Deterministic *bool     `json:"deterministic,omitempty"`
	Config        Config    `json:"config"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	Host          Host      `json:"host"`
}

// Stats summarizes a sample, in the sample's unit.
type Stats struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Summarize computes Stats of xs (nearest-rank percentiles).
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Stats{N: len(s), Mean: sum / float64(len(s)), P50: Quantile(s, 0.5),
		P90: Quantile(s, 0.9), P99: Quantile(s, 0.99), Max: s[len(s)-1]}
}

// Quantile is the nearest-rank q-quantile of sorted.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Mismatch names a reused prompt whose output differed from its reference.
type Mismatch struct {
	Index    int    `json:"index"`
	PrefixID int    `json:"prefix_id"`
	Phase    string `json:"phase,omitempty"`
	Got      string `json:"got"`
	Want     string `json:"want"`
}

// Summary is summary.json, written last: a run without it is incomplete.
type Summary struct {
	Status        string           `json:"status"` // "ok" or "failed"
	Reasons       []string         `json:"reasons,omitempty"`
	Workload      string           `json:"workload"`
	Rows          int              `json:"rows"` // lines in requests.jsonl
	Submitted     int              `json:"submitted"`
	Completed     int              `json:"completed"`
	Failed        int              `json:"failed"`
	Reused        int              `json:"reused"`
	Mismatches    int              `json:"mismatches"`
	MismatchList  []Mismatch       `json:"mismatch_list,omitempty"`
	AdmissionS    float64          `json:"admission_s"` // window start → last admission
	WindowS       float64          `json:"window_s"`    // window start → last completion (drain included)
	ThroughputRPS float64          `json:"throughput_rps"`
	OutputTokPS   float64          `json:"output_tok_s"`
	PromptTokPS   float64          `json:"prompt_tok_s"`
	TTFTMS        Stats            `json:"ttft_ms"`
	ITLMS         Stats            `json:"itl_ms"`
	LatencyMS     Stats            `json:"latency_ms"`
	CachedFrac    float64          `json:"cached_token_frac"` // Σ cached / Σ prompt tokens (server usage)
	Phases        map[string]Stats `json:"phases_ttft_ms,omitempty"`
	Notes         []string         `json:"notes,omitempty"`
	Drained       *bool            `json:"drained,omitempty"`
	Restart       *Restart         `json:"restart,omitempty"` // sustained with --restart-at
	FirstErrors   []string         `json:"first_errors,omitempty"`
}

// writeJSON writes v to dir/name through a temporary file, so that a reader
// never sees half a file.
func writeJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// rowWriter appends rows to requests.jsonl as requests finish.
type rowWriter struct {
	mu struct {
		sync.Mutex
		f    *os.File
		w    *bufio.Writer
		rows []Row
		err  error
	}
}

func newRowWriter(path string) (*rowWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	rw := &rowWriter{}
	rw.mu.f, rw.mu.w = f, bufio.NewWriter(f)
	return rw, nil
}

func (rw *rowWriter) add(r Row) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // output text like "<|17|>" stays readable
	err := enc.Encode(r)
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.mu.rows = append(rw.mu.rows, r)
	if err == nil {
		_, err = rw.mu.w.Write(append(b, '\n'))
	}
	if err == nil {
		err = rw.mu.w.Flush()
	}
	if err != nil && rw.mu.err == nil {
		rw.mu.err = err
	}
}

func (rw *rowWriter) rows() []Row {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return slices.Clone(rw.mu.rows)
}

func (rw *rowWriter) close() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if err := rw.mu.w.Flush(); err != nil && rw.mu.err == nil {
		rw.mu.err = err
	}
	if err := rw.mu.f.Close(); err != nil && rw.mu.err == nil {
		rw.mu.err = err
	}
	return rw.mu.err
}
