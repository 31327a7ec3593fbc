// Package e2e holds end-to-end tests that run the real orbitkv binary as a
// separate process: crash recovery (SIGKILL during saves), restarts, and
// multi-host tests across network namespaces (two hosts sharing pages;
// three hosts handing a prompt from a prefill to a decode reference engine,
// under link faults and a killed member: pd_test.go).
package e2e
