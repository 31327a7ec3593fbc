package hbm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
