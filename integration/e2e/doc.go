// Package e2e holds end-to-end tests that run the real orbitkv binary as a
// separate process: crash recovery (SIGKILL during saves), restarts and,
// later, multi-host tests across network namespaces.
package e2e
