package engineapi

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBufferPathOfAnOpenFile: an engine buffer named /proc/PID/fd/N (a memfd,
// SGLang's "allocator":"shm" host pool, has no other path) is accepted, and
// is refused when it is a file of the peer's data dir under another name.
func TestBufferPathOfAnOpenFile(t *testing.T) {
	dir := t.TempDir()
	p := &API{dataDir: dir}
	mfd, err := unix.MemfdCreate("orbitkv-test-pool", 0)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := p.checkBufferPath(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), mfd)); err != nil {
		t.Fatalf("a memfd through /proc: %v", err)
	}
	own, err := os.Create(filepath.Join(dir, "000.pages"))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if err := p.checkBufferPath(fmt.Sprintf("/proc/self/fd/%d", own.Fd())); err != nil {
		// /proc/self/fd/N of a regular file resolves: the plain check refuses it
		t.Logf("refused as expected: %v", err)
	} else {
		t.Fatal("a data-dir file through /proc/self/fd was accepted")
	}
	// A deleted data-dir file (EvalSymlinks fails, as for a memfd) is found by identity.
	gone, err := os.Create(filepath.Join(dir, "001.pages"))
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	link := filepath.Join(dir, "keep")
	if err := os.Link(gone.Name(), link); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone.Name()); err != nil {
		t.Fatal(err)
	}
	if err := p.checkBufferPath(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), gone.Fd())); err == nil {
		t.Fatal("an unlinked data-dir file through /proc was accepted")
	}
	for _, bad := range []string{"/proc/x/fd/3", "/proc/1/fdx/3", "/proc/1/fd", "/dev/shm/x"} {
		if isProcFD(bad) {
			t.Errorf("isProcFD(%q) = true", bad)
		}
	}
}
