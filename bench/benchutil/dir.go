package benchutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ScratchDir makes a fresh directory under parent for one benchmark's files
// (gigabytes: the SSD file, the peer's data) and returns it with a cleanup
// that removes it. The caller defers the cleanup, so the files go on an
// error and on an interrupt too (main cancels the context on SIGINT and
// SIGTERM, and the benchmark returns through its defers); parent itself and
// anything else in it are left alone.
func ScratchDir(parent, name string) (string, func(), error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", nil, fmt.Errorf("create bench dir: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "orbitkv-bench-"+name+"-")
	if err != nil {
		return "", nil, fmt.Errorf("create scratch dir: %w", err)
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

// MemoryFS names the memory-backed file system dir is (or will be) on:
// tmpfs or ramfs, by the statfs magic of dir or of its nearest existing
// ancestor; "" for any other (or when statfs fails: the benchmark's own
// open will say why).
func MemoryFS(dir string) string {
	var st unix.Statfs_t
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		err := unix.Statfs(d, &st)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || d == filepath.Dir(d) {
			return ""
		}
	}
	switch uint32(st.Type) {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.RAMFS_MAGIC:
		return "ramfs"
	}
	return ""
}
