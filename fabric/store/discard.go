package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// ErrWouldDiscard reports a start whose configuration would drop stored
// pages: the SSD tier is disabled or smaller than the files that hold them.
var ErrWouldDiscard = errors.New("the configuration would discard stored pages")

// FitSSDTier compares the stored SSD pages with the configured SSD tier:
// the catalog's, and those the scan found beyond the tier (a catalog that
// was damaged or deleted no longer names them; DESIGN.md §7). Pages the
// tier no longer covers (--ssd-bytes 0 or smaller, other --ssd-file-bytes)
// refuse the start unless --ssd-discard is given; with it they leave the
// catalog and sc (so that recovery takes no older copy in their place),
// the files beyond the tier are removed (the kept ones trimmed to their
// size), and it says how many went. Nothing is changed when the start is
// refused.
func (s *Store) FitSSDTier(sc *SSDScan) error {
	dir := s.opts.SSDDir
	files := 0
	if s.ssd != nil {
		files = s.ssd.Files()
	}
	stray, err := ssd.Stray(dir, files)
	if err != nil {
		return err
	}
	out := s.pagesOutsideSSD(sc)
	pending := s.discardPending()
	discard := s.opts.SSDDiscard || pending
	switch {
	case len(out.keys) == 0 && len(stray) == 0:
		if pending && s.ssd != nil { // a discard that got this far before a crash: finish it
			if err := s.ssd.Trim(); err != nil {
				return fmt.Errorf("discard ssd file tails: %w", err)
			}
		}
		return s.endDiscard()
	case !discard && len(out.keys) > 0:
		return fmt.Errorf("%w: %d pages (%d bytes) are stored in %s beyond the configured SSD tier (--ssd-bytes %v, --ssd-file-bytes %v): "+
			"restart with the sizes they were written under to keep them, or with --ssd-discard to drop them and remove their files",
			ErrWouldDiscard, len(out.keys), out.bytes, dir, s.opts.SSDBytes, s.opts.SSDFileBytes)
	case !discard:
		s.log.Warn().Strs("files", stray).Msg("ssd page files beyond the configured tier hold no current pages; left in place (--ssd-discard removes them)")
		return nil
	}
	if pending && !s.opts.SSDDiscard {
		s.log.Warn().Msg("--ssd-discard: finishing the discard an earlier start began (its marker is in the ssd dir)")
	}
	sc.forget(out.keys)
	return s.discardSSD(out, stray)
}

// A discard changes three things in turn: the catalog, the page files
// beyond the tier, the tails of the kept files. A crash between them
// (issue 34, item 6c) left a catalog that had forgotten pages whose files
// were still there (a start without --ssd-discard then refused), or, with
// a catalog that could not persist the deletions, one still naming pages
// whose files were gone (refused again, naming pages no size could bring
// back). So the decision is made durable first: discardMarkerName in the
// ssd dir records the tier sizes the discard is for; a start that finds it
// under the same sizes discards as if --ssd-discard were given, and it is
// removed only once the catalog persisted the deletions (or a start finds
// nothing left to discard). Every step is idempotent, so a crash at any
// point leads to a start that finishes the discard.

// discardMarkerName is the file, in the ssd dir, saying a discard began.
const discardMarkerName = "orbitkv-discard"

const discardMarkerFormat = "orbitkv ssd discard v1\nssd_bytes %d\nssd_file_bytes %d\n"

func (s *Store) discardMarkerBody() string {
	return fmt.Sprintf(discardMarkerFormat, uint64(s.opts.SSDBytes), uint64(s.opts.SSDFileBytes))
}

// discardPending reports a marker of a discard for the configured sizes.
// A marker for other sizes is not followed: under them the operator
// decides again.
func (s *Store) discardPending() bool {
	b, err := os.ReadFile(filepath.Join(s.opts.SSDDir, discardMarkerName))
	return err == nil && string(b) == s.discardMarkerBody()
}

// beginDiscard writes the marker durably (writeDurably).
func (s *Store) beginDiscard() error {
	dir := s.opts.SSDDir
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		err = writeDurably(dir, discardMarkerName, s.discardMarkerBody())
	}
	if err != nil {
		return fmt.Errorf("discard marker: %w", err)
	}
	return nil
}

// endDiscard removes the marker, if there is one, durably.
func (s *Store) endDiscard() error {
	err := os.Remove(filepath.Join(s.opts.SSDDir, discardMarkerName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = syncDir(s.opts.SSDDir)
	}
	if err != nil {
		return fmt.Errorf("remove the discard marker: %w", err)
	}
	return nil
}

// testDiscardCrashEnv names a test-only hook: set to a step's name
// (marker, catalog, file, files, trim), a discard stops with an error
// right after that step, leaving the disk as a crash there would.
const testDiscardCrashEnv = "ORBITKV_TEST_DISCARD_CRASH"

func discardCrash(step string) error {
	if os.Getenv(testDiscardCrashEnv) == step {
		return fmt.Errorf("%s=%s: discard stopped after that step", testDiscardCrashEnv, step)
	}
	return nil
}

// discardSSD drops the outside pages from the catalog, then removes the
// stray files and trims the kept ones: the catalog never names a slot whose
// bytes are gone. The marker is written first and removed last.
func (s *Store) discardSSD(out outsidePages, stray []string) error {
	if err := s.beginDiscard(); err != nil {
		return err
	}
	if err := discardCrash("marker"); err != nil {
		return err
	}
	if len(out.catalogued) > 0 {
		if err := s.cat.Delete(out.catalogued...); err != nil {
			return fmt.Errorf("discard %d ssd pages: %w", len(out.keys), err)
		}
	}
	if err := discardCrash("catalog"); err != nil {
		return err
	}
	for _, f := range stray {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("discard ssd file: %w", err)
		}
		if err := discardCrash("file"); err != nil {
			return err
		}
	}
	if err := discardCrash("files"); err != nil {
		return err
	}
	if s.ssd != nil {
		if err := s.ssd.Trim(); err != nil {
			return fmt.Errorf("discard ssd file tails: %w", err)
		}
	}
	if err := discardCrash("trim"); err != nil {
		return err
	}
	// The marker stays while the catalog cannot persist the deletions: a
	// crash before Repair would leave it naming the pages given up.
	if s.cat.Health() == nil {
		if err := s.endDiscard(); err != nil {
			return err
		}
	}
	if s.ssd == nil { // no tier left: its generation limit bounds no header
		_ = os.Remove(filepath.Join(s.opts.SSDDir, genLimitName))
		_ = os.Remove(s.opts.SSDDir) // only if empty
	}
	s.log.Warn().Int("discarded_pages", len(out.keys)).Strs("removed_files", stray).
		Msg("--ssd-discard: dropped the ssd pages the configured tier no longer holds")
	return nil
}

// outsidePages are the stored SSD pages outside the configured tier.
type outsidePages struct {
	keys       []pagekey.Key // every such page's key, once
	catalogued []pagekey.Key // those the catalog names
	bytes      uint64
}

// pagesOutsideSSD lists the stored SSD pages outside the configured tier:
// the catalog's entries whose slot the tier does not hold, and each key
// found beyond the tier whose copy there recovery would otherwise have
// taken, were the tier as large as before: the catalog does not vouch for
// an entry of the key inside the tier (its slot's header confirms it, or
// the tier was not scanned) and no copy inside the tier is newer. Older
// copies beyond the tier are freed slots' bytes, as inside it.
func (s *Store) pagesOutsideSSD(sc *SSDScan) outsidePages {
	inside := map[pagekey.Key][]catalog.Entry{}
	for _, f := range sc.found {
		inside[f.Header.Key] = append(inside[f.Header.Key], entryOfFound(f))
	}
	beyond := map[pagekey.Key]ssd.Found{}
	for _, f := range sc.beyond {
		if b, ok := beyond[f.Header.Key]; !ok || f.Header.Generation > b.Header.Generation {
			beyond[f.Header.Key] = f
		}
	}
	var out outsidePages
	takesBeyond := func(k pagekey.Key) bool {
		b, ok := beyond[k]
		if !ok {
			return false
		}
		for _, e := range inside[k] {
			if e.Generation >= b.Header.Generation {
				return false
			}
		}
		return true
	}
	s.cat.Range(func(e catalog.Entry) bool {
		switch {
		case e.OnSSD && (s.ssd == nil || !s.ssd.Holds(ssdLoc(e.SSD))):
			out.add(e.Key, e.Size, true)
		case !e.OnSSD || !sc.scanned:
		case vouched(e, inside[e.Key]):
		case takesBeyond(e.Key):
			out.add(e.Key, beyond[e.Key].Header.Length, true)
		}
		delete(beyond, e.Key)
		return true
	})
	for k, b := range beyond {
		if takesBeyond(k) {
			out.add(k, b.Header.Length, false)
		}
	}
	return out
}

func (o *outsidePages) add(k pagekey.Key, size uint64, catalogued bool) {
	o.keys = append(o.keys, k)
	o.bytes += size
	if catalogued {
		o.catalogued = append(o.catalogued, k)
	}
}

// vouched reports whether a found copy inside the tier confirms e (recovery
// then keeps e).
func vouched(e catalog.Entry, inside []catalog.Entry) bool {
	_, ok := confirm(e, inside)
	return ok
}
