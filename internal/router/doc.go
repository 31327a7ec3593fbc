// Package router is OrbitKV's reference router: an HTTP proxy in front of
// several engines that serve the OpenAI completions API with token-id
// prompts (the reference engine, vLLM). For each completion it asks the
// local peer's route API (POST /v1/route on the peer's metrics listener)
// which hosts hold how many leading pages of the prompt, and forwards the
// request to the engine on the best host that has one; when no host holds
// a leading page, or the peer does not answer in time, it forwards round
// robin. It is a reference for the shape a router consumes
// (docs/cluster.md, "Routing by where KV lives"), not a product: no
// retries, no load awareness, no streaming of the request body.
//
// Invariants:
//  1. A route answer only chooses among the configured engines: a host
//     without an engine here is skipped, never dialled.
//  2. The route query has its own deadline (Config.RouteTimeout); a slow
//     or absent peer costs at most that, then round robin.
//  3. The choice (pick) is pure: the answer, the engine names and the
//     round-robin counter in, an engine name out.
package router
