// Package buildinfo says which build is running: the version and git
// revision `make build` stamps into the binary with -X, or, for a plain
// `go build`, what the Go toolchain recorded (vcs.revision, when built with
// VCS stamping), else "dev" and "unknown".
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time: go build -ldflags "-X github.com/orbitkv/orbitkv/internal/buildinfo.version=V
// -X github.com/orbitkv/orbitkv/internal/buildinfo.revision=R" (the Makefile does).
var (
	version  = ""
	revision = ""
)

// Version is the release version ("dev" when not stamped).
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Revision is the git commit the binary was built from ("unknown" when
// neither stamped nor recorded by the toolchain); "-dirty" marks a build
// of a modified tree where the toolchain says so.
func Revision() string {
	if revision != "" {
		return revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// GoVersion is the Go toolchain that built the binary.
func GoVersion() string { return runtime.Version() }

// String is the one-line description: "0.1.0 (revision 1ad5ae9…, go1.26.0)".
func String() string {
	return fmt.Sprintf("%s (revision %s, %s)", Version(), Revision(), GoVersion())
}
