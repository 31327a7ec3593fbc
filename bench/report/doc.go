// Package report is `orbitkv bench report`: it validates serving run
// directories written by package serving, rejects failed, incomplete,
// duplicated and out-of-budget windows, and compares configurations as
// ratios over independent process pairs with bootstrap confidence intervals,
// writing report.md and PNG plots.
//
// Invariants: a report is written only when every run given is accepted;
// the bootstrap uses a fixed seed, so the same runs give the same report.
package report
