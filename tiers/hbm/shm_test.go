package hbm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestMapSharedSeesEngineWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv")
	if err := os.WriteFile(path, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := MapShared(path, 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Bytes()[100] = 42
	f, _ := os.ReadFile(path)
	if f[100] != 42 {
		t.Fatal("write through the mapping did not reach the file")
	}
	if err := s.Close(); err != nil || s.Close() != nil {
		t.Fatal("close must be idempotent")
	}
}

func TestMapSharedRejects(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	os.WriteFile(small, make([]byte, 10), 0o600)
	for name, c := range map[string]struct {
		path string
		size uint64
	}{
		"relative":  {"kv", 10},
		"missing":   {filepath.Join(dir, "nope"), 10},
		"too small": {small, 4096},
		"directory": {dir, 10},
		"zero size": {small, 0},
	} {
		if _, err := MapShared(c.path, c.size); !errors.Is(err, ErrBuffer) {
			t.Errorf("%s: want ErrBuffer, got %v", name, err)
		}
	}
}

func TestSharedCheckSeesShrink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv")
	if err := os.WriteFile(path, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := MapShared(path, 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatalf("check of an intact file: %v", err)
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); !errors.Is(err, ErrBuffer) || !strings.Contains(err.Error(), path) {
		t.Fatalf("check of a shrunk file: %v, want ErrBuffer naming %s", err, path)
	}
	if err := os.Truncate(path, 16384); err != nil { // grown back (and past): covered again
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("check of a regrown file: %v", err)
	}
}

// shmDir is a tmpfs directory where one exists (the engines' /dev/shm), else
// the test's temporary directory.
func shmDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "okv-hbm-test-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// A registration returns before its buffer is faulted in (a fresh 4 GiB pool
// took longer than the engine's open deadline), and Close stops the populate
// and waits for it before unmapping.
func TestMapSharedPopulatesBehindTheRegistration(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var sawStop bool
	orig := populate
	populate = func(mem []byte, stop <-chan struct{}) {
		close(entered)
		select {
		case <-stop:
			sawStop = true
		case <-release:
		}
	}
	defer func() { populate = orig }()
	path := filepath.Join(shmDir(t), "kv")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := MapShared(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	<-entered // MapShared returned while its populate was held
	select {
	case <-s.Populated():
		t.Fatal("Populated closed while the populate was still running")
	default:
	}
	s.Bytes()[5] = 7 // the mapping is usable meanwhile
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !sawStop {
		t.Fatal("Close returned without stopping the populate")
	}
	<-s.Populated()
	close(release)
}

// The background populate faults every page in and changes no byte.
func TestMapSharedFaultsEveryPageInAndWritesNothing(t *testing.T) {
	const size = 3*populateChunk/2 + 4096 // more than one chunk, a partial last one
	path := filepath.Join(shmDir(t), "kv")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil { // a hole: no page exists yet
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("engine bytes"), populateChunk+100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s, err := MapShared(path, size)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	select {
	case <-s.Populated():
	case <-time.After(2 * time.Minute): // a deadline only: the populate of 96 MiB never takes this long
		t.Fatal("populate did not end")
	}
	vec := make([]byte, (size+4095)/4096)
	mem := s.Bytes()
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for i, v := range vec {
		if v&1 == 0 {
			t.Fatalf("page %d of %d is not resident after the populate", i, len(vec))
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		want := byte(0)
		if j := i - (populateChunk + 100); j >= 0 && j < len("engine bytes") {
			want = "engine bytes"[j]
		}
		if b != want {
			t.Fatalf("byte %d is %d after the populate, want %d", i, b, want)
		}
	}
}

// A file the engine shrank under the mapping: the populate stops at the
// missing pages with false, on either path, and never faults the peer.
func TestPrefaultOfAShrunkFileStopsWithoutAFault(t *testing.T) {
	path := filepath.Join(shmDir(t), "kv")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	orig := populate
	populate = func([]byte, <-chan struct{}) {} // this test drives prefault itself
	defer func() { populate = orig }()
	s, err := MapShared(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !prefault(s.Bytes()) {
		t.Fatal("prefault of an intact file failed")
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if prefault(s.Bytes()) {
		t.Fatal("prefault of pages past the file's end reported success")
	}
	if readPages(s.Bytes()) {
		t.Fatal("reading pages past the file's end reported success")
	}
}
