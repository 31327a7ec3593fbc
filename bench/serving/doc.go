// Package serving is the engine-facing half of `orbitkv bench serving`: it
// drives an OpenAI-compatible /v1/completions endpoint with streaming (or
// SGLang's native /generate, Config.API) and records what a person needs to judge a serving window.
//
// Invariants:
//   - Workloads are pure functions of (seed, request index): the same seed
//     gives the same prompts in the same order, and equal trace hash ids give
//     equal tokens (hence equal OrbitKV page keys).
//   - Every request has a deadline; the admission window is followed by a
//     drain in which every submitted request completes or fails by deadline.
//   - A run directory holds manifest.json (written first), requests.jsonl
//     (one row per measured request, appended as they finish), metrics.json,
//     drain.json and summary.json (written last). A directory without
//     summary.json is an incomplete run.
//   - TTFT ends at the first non-empty SSE text; throughput counts the whole
//     window including the drain.
package serving
