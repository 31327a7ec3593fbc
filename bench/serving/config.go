package serving

import (
	"encoding/json"
	"fmt"
	"net/url"
	"time"
)

// Workload names.
const (
	WorkloadSustained = "sustained"
	WorkloadTrace     = "trace"
	WorkloadProbes    = "probes"
)

// Duration is a time.Duration that reads and writes JSON as "20s".
type Duration time.Duration

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Config is one `bench serving` run. Units are in the field comments.
type Config struct {
	Endpoint       string   `json:"endpoint"` // base URL of the engine's HTTP server
	API            string   `json:"api"`      // openai (/v1/completions) | sglang (/generate)
	Model          string   `json:"model"`    // "model" field of each request
	Workload       string   `json:"workload"` // sustained | trace | probes
	Output         string   `json:"output"`   // run directory (created; must not hold a run)
	Seed           uint64   `json:"seed"`
	Vocab          int      `json:"vocab"`           // token ids lie in [0, vocab)
	Concurrency    int      `json:"concurrency"`     // requests outstanding at most
	Duration       Duration `json:"duration"`        // admission window; then drain
	MaxRequests    int      `json:"max_requests"`    // 0: unlimited within the window
	OutputTokens   int      `json:"output_tokens"`   // per request (trace: cap on output_length)
	RequestTimeout Duration `json:"request_timeout"` // deadline of one request
	IgnoreEOS      bool     `json:"ignore_eos"`

	Prefixes     int     `json:"prefixes"`      // sustained: prepared prefixes
	PrefixTokens []int   `json:"prefix_tokens"` // sustained: lengths, cycled
	Reuse        float64 `json:"reuse"`         // sustained: reuse probability

	TracePath string  `json:"trace_path,omitempty"` // trace: Mooncake-format JSONL
	TimeScale float64 `json:"time_scale"`           // trace: multiplies arrival offsets
	MaxInput  int     `json:"max_input"`            // trace: prompt cap, tokens; 0 = none

	ProbeTokens    int      `json:"probe_tokens"`          // probes: prompt length
	ProbeReps      int      `json:"probe_reps"`            // probes: fresh prompts measured
	FillerTokens   int      `json:"filler_tokens"`         // probes: tokens sent to evict the prompt
	RestartCmd     string   `json:"restart_cmd,omitempty"` // probes, sustained: shell command that restarts the engine
	RestartTimeout Duration `json:"restart_timeout"`       // restart + readiness deadline
	RestartAt      Duration `json:"restart_at,omitempty"`  // sustained: restart the engine this far into the window (0: never)

	PeerMetrics   string   `json:"peer_metrics,omitempty"`   // OrbitKV peer /metrics URL
	EngineMetrics string   `json:"engine_metrics,omitempty"` // engine /metrics URL (optional)
	DrainTimeout  Duration `json:"drain_timeout"`            // wait for the peer's gauges to reach 0
	SampleEvery   Duration `json:"sample_every"`             // gauge sampling during the window
	RequireMatch  bool     `json:"require_match"`            // output mismatches fail the run
}

// DefaultConfig is the seeds' sustained workload.
func DefaultConfig() Config {
	return Config{
		Endpoint: "http://127.0.0.1:8000", API: APIOpenAI, Workload: WorkloadSustained, Seed: 1, Vocab: 32000,
		Concurrency: 8, Duration: Duration(60 * time.Second), OutputTokens: 16,
		RequestTimeout: Duration(300 * time.Second), IgnoreEOS: true,
		Prefixes: 12, PrefixTokens: []int{1024, 4096, 8192}, Reuse: 0.75,
		TimeScale: 1, ProbeTokens: 8192, ProbeReps: 3, FillerTokens: 32768,
		RestartTimeout: Duration(180 * time.Second), DrainTimeout: Duration(30 * time.Second),
		SampleEvery: Duration(time.Second),
	}
}

// Validate reports a config that cannot run, naming the flag.
func (c Config) Validate() error {
	if _, err := url.ParseRequestURI(c.Endpoint); err != nil || c.Endpoint == "" {
		return fmt.Errorf("--endpoint %q is not a URL", c.Endpoint)
	}
	if c.Output == "" {
		return fmt.Errorf("--output DIR is required")
	}
	if c.API != "" && c.API != APIOpenAI && c.API != APISGLang {
		return fmt.Errorf("--api %q: want %s or %s", c.API, APIOpenAI, APISGLang)
	}
	switch {
	case c.Concurrency <= 0:
		return fmt.Errorf("--concurrency must be positive")
	case c.Duration <= 0:
		return fmt.Errorf("--duration must be positive")
	case c.RequestTimeout <= 0 || c.DrainTimeout <= 0 || c.SampleEvery <= 0:
		return fmt.Errorf("--request-timeout, --drain-timeout and --sample-every must be positive")
	case c.MaxRequests < 0 || c.OutputTokens < 0 || c.MaxInput < 0:
		return fmt.Errorf("--max-requests, --output-tokens and --max-input must not be negative")
	}
	switch {
	case c.RestartAt < 0:
		return fmt.Errorf("--restart-at must not be negative")
	case c.RestartAt > 0 && (c.Workload != WorkloadSustained || c.RestartCmd == ""):
		return fmt.Errorf("--restart-at needs --workload sustained and --restart-cmd")
	case c.RestartAt >= c.Duration:
		if c.RestartAt > 0 {
			return fmt.Errorf("--restart-at must fall inside --duration")
		}
	}
	switch c.Workload {
	case WorkloadSustained:
		return c.sustained().Validate()
	case WorkloadTrace:
		if c.TracePath == "" {
			return fmt.Errorf("--workload trace needs --trace PATH")
		}
		if c.TimeScale <= 0 {
			return fmt.Errorf("--time-scale must be positive")
		}
	case WorkloadProbes:
		if c.ProbeTokens <= 0 || c.ProbeReps <= 0 || c.FillerTokens < 0 {
			return fmt.Errorf("--probe-tokens and --probe-reps must be positive, --filler-tokens not negative")
		}
	default:
		return fmt.Errorf("--workload %q: want sustained, trace or probes", c.Workload)
	}
	if c.Vocab < 2 {
		return fmt.Errorf("--vocab must be at least 2")
	}
	return nil
}

func (c Config) sustained() Sustained {
	return Sustained{Seed: c.Seed, Prefixes: c.Prefixes, PrefixTokens: c.PrefixTokens,
		Reuse: c.Reuse, OutputTokens: c.OutputTokens, Vocab: c.Vocab}
}
