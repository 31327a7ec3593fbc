package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

// TestStampedValuesWin: what the Makefile stamps with -X is what the binary
// reports; unstamped, it still names a version and a revision.
func TestStampedValuesWin(t *testing.T) {
	if Version() == "" || Revision() == "" {
		t.Fatalf("unstamped: version %q revision %q", Version(), Revision())
	}
	old, oldRev := version, revision
	t.Cleanup(func() { version, revision = old, oldRev })
	version, revision = "1.2.3", "abcdef0"
	if got, want := String(), "1.2.3 (revision abcdef0, "+runtime.Version()+")"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if !strings.HasPrefix(GoVersion(), "go") {
		t.Fatalf("GoVersion %q", GoVersion())
	}
}
