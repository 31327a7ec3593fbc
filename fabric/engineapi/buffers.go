package engineapi

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// linkedInto finds the file under dir that path is a hard link of; "" when
// none (the common case, a file with one link, costs one stat).
func linkedInto(dir, path string) string {
	fi, err := os.Stat(path)
	if st, ok := fi.Sys().(*syscall.Stat_t); err != nil || !ok || st.Nlink < 2 {
		return ""
	}
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
