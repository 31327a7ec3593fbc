package engineapi

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/orbitkv/orbitkv/tiers/hbm"
)

// Engine buffers are untrusted: where a session's shared-memory buffer may
// live (never in the peer's data dir), and whether it is still whole when
// an operation starts (an engine may shrink its file under the mapping; a
// copy that races such a shrink faults, and transfer.Local turns the fault
// into an error).

// checkBuffers fails when a shared-memory buffer's file shrank under its
// mapping (engine memory is untrusted): the operation is refused before any
// copy could fault. The first such refusal of a session is logged. It
// holds the session open (begin) so its buffers stay mapped meanwhile.
func (p *API) checkBuffers(s *session) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.work.Done()
	for _, m := range s.mapped {
		if err := m.Check(); err != nil {
			p.noteFault(s, err)
			return fmt.Errorf("session %s: %w", s.id, err)
		}
	}
	return nil
}

// noteFault counts an engine buffer fault and logs a session's first.
func (p *API) noteFault(s *session, err error) {
	p.pages.NoteEngineFault()
	if !s.faulted.Swap(true) {
		p.log.Warn().Str("session", s.id).Str("engine", s.engineID).Err(err).
			Msg("engine kv buffer fault: the session's operations fail until it reopens; other sessions are unaffected")
	}
}

// checkBufferPath refuses an engine buffer that resolves, symlinks
// followed, to a path inside the peer's data dir: its SSD page files and its
// catalog are the peer's own, and a session mapping them would overwrite
// stored pages with its KV blocks.
func (p *API) checkBufferPath(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil && isProcFD(path) {
		return p.checkOpenFile(path)
	}
	if err != nil {
		return fmt.Errorf("%w: resolve %s: %v", hbm.ErrBuffer, path, err)
	}
	dir := p.dataDir
	if rel, err := filepath.Rel(dir, real); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return invalid("buffer %s is %s, inside the peer's data dir %s (its SSD page files and catalog): put engine buffers elsewhere, e.g. /dev/shm", path, real, dir)
	}
	if peer := linkedInto(dir, real); peer != "" {
		return invalid("buffer %s is a hard link of %s in the peer's data dir: put engine buffers elsewhere, e.g. /dev/shm", path, peer)
	}
	return nil
}

// isProcFD reports whether path names an open file of a process,
// /proc/PID/fd/N: how an engine hands over memory with no path of its own (a
// memfd: SGLang's "allocator":"shm" host pool), which the peer opens through
// that link while the engine keeps the descriptor open.
func isProcFD(path string) bool {
	parts := strings.Split(filepath.Clean(path), string(filepath.Separator))
	if len(parts) != 5 || parts[0] != "" || parts[1] != "proc" || parts[3] != "fd" {
		return false
	}
	_, e1 := strconv.Atoi(parts[2])
	_, e2 := strconv.Atoi(parts[4])
	return e1 == nil && e2 == nil
}

// checkOpenFile refuses a /proc/PID/fd/N buffer that is a file of the
// peer's data dir (the same file, whatever its name); files on another
// filesystem than the data dir's, memfds among them, cannot be.
func (p *API) checkOpenFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: open file %s: %v", hbm.ErrBuffer, path, err)
	}
	dir, err := os.Stat(p.dataDir)
	if err != nil {
		return fmt.Errorf("%w: data dir %s: %v", hbm.ErrBuffer, p.dataDir, err)
	}
	a, ok1 := fi.Sys().(*syscall.Stat_t)
	b, ok2 := dir.Sys().(*syscall.Stat_t)
	if ok1 && ok2 && a.Dev != b.Dev {
		return nil
	}
	if peer := sameFileIn(p.dataDir, fi); peer != "" {
		return invalid("buffer %s is %s in the peer's data dir: put engine buffers elsewhere, e.g. /dev/shm", path, peer)
	}
	return nil
}

// sameFileIn finds the file under dir that is fi; "" when none.
func sameFileIn(dir string, fi os.FileInfo) string {
	var found string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found != "" {
			return nil
		}
		if other, err := os.Stat(p); err == nil && os.SameFile(fi, other) {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// linkedInto finds the file under dir that path is a hard link of; "" when
// none (the common case, a file with one link, costs one stat).
func linkedInto(dir, path string) string {
	fi, err := os.Stat(path)
	if st, ok := fi.Sys().(*syscall.Stat_t); err != nil || !ok || st.Nlink < 2 {
		return ""
	}
	return sameFileIn(dir, fi)
}
