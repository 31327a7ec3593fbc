// Package lint holds tests that keep the architecture visible: the import
// layers of DESIGN.md §4, the cgo allowlist and package doc comments.
package lint
