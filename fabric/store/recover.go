package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// Recovery at start (DESIGN.md §7 "the catalog is rebuildable"): the
// catalog's persisted entries are checked against the page files' slot
// headers, which are self-describing. A catalog that was damaged, set
// aside, deleted or silently truncated by Pebble (a flipped bit in the
// MANIFEST or the last WAL) is rebuilt from the headers; an entry whose
// slot no longer holds its page is dropped; nothing is served that the
// page files do not hold whole. Where the catalog names a key it is the
// record of what was acknowledged: headers rebuild only what it lost (keys
// it does not name, newer generations whose commit it lost), and a slot
// that contradicts the entry naming it is dropped, never adopted
// (contradicting), as is one whose generation is above any the store can
// have handed out (genlimit.go).
//
// How much is read is the caller's ScanMode (fabric decides: its
// clean-shutdown marker): nothing after a clean stop, header blocks only
// while the catalog is intact, the whole files when it was damaged. With
// headers only, a candidate the catalog does not vouch for is read whole
// before it is taken (reserveFirst); the catalog's own entries are checked
// where they are read, as every SSD read is.

// RecoverReport is what recovery did, for the start log and the metrics.
type RecoverReport struct {
	Kept    int // catalog entries whose page the files hold
	Rebuilt int // pages taken from the page files that the catalog did not name right
	Dropped int // catalog entries whose page the files do not hold
	// Contradicting are the slots whose header contradicts the catalog
	// entry naming the slot (Found.Loc, the entry's key) or carries a
	// generation above GenLimit: dropped.
	Contradicting []ContradictingSlot
	Scan          ssd.ScanStats
	Scanned       bool
	Mode          ScanMode // how the start checked the page files
	// Verified counts the pages not vouched for by the catalog whose data a
	// headers-only scan read before adopting them; Unverifiable those it
	// gave up (torn, or not the page their header says).
	Verified, Unverifiable int
	// GenLimit is the generation limit the headers were checked against
	// (genlimit.go); 0 when none was recorded.
	GenLimit uint64
}

// ScanMode is how a start checks the catalog against the page files.
type ScanMode int

const (
	// ScanNone trusts the catalog: a clean shutdown's marker vouches for
	// it and the files (fabric's clean-shutdown marker), or there is
	// nothing to check (no page files and no SSD entries).
	ScanNone ScanMode = iota
	// ScanHeaders reads the slots' header blocks only (ssd.ScanHeaders):
	// an intact catalog after an unclean stop. A page the catalog does not
	// vouch for has its data verified before it is adopted; the catalog's
	// own pages are verified where they are read.
	ScanHeaders
	// ScanFull reads the page files whole (ssd.Scan), verifying every
	// page: the catalog was damaged and is rebuilt from them.
	ScanFull
)

func (m ScanMode) String() string {
	switch m {
	case ScanNone:
		return "none"
	case ScanHeaders:
		return "headers"
	case ScanFull:
		return "full"
	}
	return fmt.Sprintf("ScanMode(%d)", int(m))
}

// ContradictingSlot is a slot whose header contradicts the catalog entry
// naming it: Entry is the catalog's record, Found what the slot holds.
// AboveLimit: the header's generation is above the generation limit, so
// no save of this store wrote it; Entry is then zero when no entry names
// the slot.
type ContradictingSlot struct {
	Entry      catalog.Entry
	Found      ssd.Found
	AboveLimit bool
}

// recoverChoice is one key's candidates, best first; vouched says the
// first is the catalog's own entry, confirmed by the slot's header.
type recoverChoice struct {
	key       pagekey.Key
	cands     []catalog.Entry
	inCatalog bool
	vouched   bool
}

// reconcile decides, without I/O, what each key recovers from: the catalog
// entries and the pages the scan found (all of them when scanned is false:
// then the catalog is trusted as it is). Per key the candidates are the
// catalog's entry if a found slot confirms it (same slot, generation,
// layout, length and checksum), then the found copies the catalog lost:
// for a key it names, only newer generations than its entry's; for one it
// does not, every copy. Newest generation first. Confirmed keys come
// first, in the order the caller reserves them, so a stale copy never
// takes the region of a live page. found must hold no contradicting slot
// (contradicting).
func reconcile(entries []catalog.Entry, found []ssd.Found, scanned bool) []recoverChoice {
	byKey := map[pagekey.Key][]catalog.Entry{}
	for _, f := range found {
		byKey[f.Header.Key] = append(byKey[f.Header.Key], entryOfFound(f))
	}
	for k := range byKey {
		slices.SortFunc(byKey[k], func(a, b catalog.Entry) int { return cmp.Compare(b.Generation, a.Generation) })
	}
	var out []recoverChoice
	for _, e := range entries {
		ch := recoverChoice{key: e.Key, inCatalog: true}
		switch {
		case !e.OnSSD:
		case !scanned:
			ch.cands, ch.vouched = []catalog.Entry{e}, true
		default:
			ch.cands, ch.vouched = confirm(e, byKey[e.Key])
		}
		delete(byKey, e.Key)
		out = append(out, ch)
	}
	for k, cands := range byKey {
		out = append(out, recoverChoice{key: k, cands: cands})
	}
	slices.SortStableFunc(out, func(a, b recoverChoice) int {
		switch {
		case a.vouched != b.vouched:
			if a.vouched {
				return -1
			}
			return 1
		case len(a.cands) == 0 || len(b.cands) == 0:
			return cmp.Compare(len(b.cands), len(a.cands))
		}
		return cmp.Compare(b.cands[0].Generation, a.cands[0].Generation)
	})
	return out
}

// confirm orders a catalog entry's candidates: the entry itself first when
// one found copy is exactly its slot and header, then the copies of a newer
// generation (saves whose commit the catalog lost; it was made durable
// before it named them). Older copies are freed slots' bytes the entry
// replaced: the catalog vouches for none of them. Rebuilt copies keep the
// entry's access time and hits.
func confirm(e catalog.Entry, found []catalog.Entry) ([]catalog.Entry, bool) {
	var out []catalog.Entry
	vouched := false
	for _, f := range found {
		switch {
		case matches(e, f):
			vouched = true
		case f.Generation > e.Generation:
			f.LastAccess, f.Hits = e.LastAccess, e.Hits
			out = append(out, f)
		}
	}
	if vouched {
		out = append([]catalog.Entry{e}, out...)
	}
	return out, vouched
}

// matches reports whether the found copy f is exactly the catalog's entry e.
func matches(e, f catalog.Entry) bool {
	return f.Key == e.Key && f.SSD == e.SSD && f.Generation == e.Generation && f.Layout == e.Layout &&
		f.Size == e.Size && f.Checksum == e.Checksum
}

// contradicting splits found into the copies recovery may take and the
// slots that contradict the catalog entry naming them: a page at the
// entry's generation or an older one that is not the entry's (another key,
// layout, length or checksum). A slot is written whole, under a new
// generation, and made durable before the catalog names it, so no crash
// leaves such a header: it is damage or a forgery, and the catalog, the
// record of what was acknowledged, wins. A newer generation there is the
// slot's reuse by a save whose commit the catalog lost, if it is within
// limit (0: none recorded); any slot above limit is nobody's save
// (genlimit.go) unless it is exactly the entry naming it.
func contradicting(entries []catalog.Entry, found []ssd.Found, limit uint64) ([]ssd.Found, []ContradictingSlot) {
	type slotAt struct {
		file   uint32
		offset uint64
	}
	named := map[slotAt]catalog.Entry{}
	for _, e := range entries {
		if e.OnSSD {
			named[slotAt{e.SSD.File, e.SSD.Offset}] = e
		}
	}
	var usable []ssd.Found
	var bad []ContradictingSlot
	for _, f := range found {
		e, ok := named[slotAt{f.Loc.File, f.Loc.Offset}]
		above := aboveLimit(f, limit)
		switch {
		case ok && matches(e, entryOfFound(f)):
		case above:
			bad = append(bad, ContradictingSlot{Entry: e, Found: f, AboveLimit: true})
			continue
		case ok && f.Header.Generation <= e.Generation:
			bad = append(bad, ContradictingSlot{Entry: e, Found: f})
			continue
		}
		usable = append(usable, f)
	}
	return usable, bad
}

// aboveLimit reports whether f's generation is above limit (0: none
// recorded, nothing is).
func aboveLimit(f ssd.Found, limit uint64) bool { return limit > 0 && f.Header.Generation > limit }

// entryOfFound is the catalog entry a slot's header describes: the page on
// SSD at the slot, with no DRAM copy (the one constructor of an entry from
// a header: recovery's candidates, the discard's view of the files).
func entryOfFound(f ssd.Found) catalog.Entry {
	h := f.Header
	return catalog.Entry{Key: h.Key, Layout: h.Layout, Size: h.Length, Checksum: h.Checksum,
		Generation: h.Generation, DRAMSlot: -1, OnSSD: true, SSD: catLoc(f.Loc)}
}

// SSDScan is what a start read from the page files: the whole pages inside
// the configured tier (recovery's source) and those beyond it, which only a
// shrunk configuration has (fitSSDTier's, with the catalog's).
type SSDScan struct {
	scanned bool // the tier's files were read; else the catalog is trusted
	mode    ScanMode
	limit   uint64 // the recorded generation limit (genlimit.go); 0: none
	stats   ssd.ScanStats
	found   []ssd.Found // inside the tier
	beyond  []ssd.Found // outside it: past a file's size, in files it does not use
}

// ScanSSD reads the page files in dir at start: the tier's as mode says
// (ScanHeaders guided by the regions the catalog names), and, whatever the
// mode, what lies beyond the tier, so that pages the catalog lost there are
// not given up unseen (only files reaching past the tier are read).
func (s *Store) ScanSSD(dir string, mode ScanMode) (SSDScan, error) {
	sc := SSDScan{mode: mode}
	sc.limit, _ = readGenLimit(dir)
	if s.ssd == nil {
		sc.mode = ScanNone
	}
	var err error
	add := func(f ssd.Found) { sc.found = append(sc.found, f) }
	switch sc.mode {
	case ScanHeaders:
		var named []ssd.Loc
		s.cat.Range(func(e catalog.Entry) bool {
			if e.OnSSD && s.ssd.Holds(ssdLoc(e.SSD)) {
				named = append(named, ssdLoc(e.SSD))
			}
			return true
		})
		sc.stats, err = s.ssd.ScanHeaders(named, add)
	case ScanFull:
		sc.stats, err = s.ssd.Scan(add)
	}
	if err != nil {
		return sc, err
	}
	sc.scanned = sc.mode != ScanNone
	if _, err := ssd.ScanBeyond(dir, s.ssd, func(f ssd.Found) { sc.beyond = append(sc.beyond, f) }); err != nil {
		return sc, fmt.Errorf("beyond the configured tier: %w", err)
	}
	return sc, nil
}

// forget drops the found pages of keys (given up by --ssd-discard): no
// older copy of theirs inside the tier comes back in their place.
func (sc *SSDScan) forget(keys []pagekey.Key) {
	gone := map[pagekey.Key]bool{}
	for _, k := range keys {
		gone[k] = true
	}
	sc.found = slices.DeleteFunc(sc.found, func(f ssd.Found) bool { return gone[f.Header.Key] })
	sc.beyond = slices.DeleteFunc(sc.beyond, func(f ssd.Found) bool { return gone[f.Header.Key] })
}

// Recover rebuilds the catalog, SSD allocation and LRU order at start.
// When sc scanned the tier's files they are reconciled with the catalog
// (slots that contradict it are left free and reported); else the catalog
// is trusted. Every kept page's slot is Reserved; a candidate whose slot
// cannot be (out of range, overlapping a kept page) gives way to the key's
// next candidate. Pages beyond the tier are not recovery's: fitSSDTier
// ruled on them first.
func (s *Store) Recover(sc SSDScan) (RecoverReport, error) {
	rep := RecoverReport{Scan: sc.stats, Scanned: sc.scanned, Mode: sc.mode, GenLimit: sc.limit}
	var entries []catalog.Entry
	s.cat.Range(func(e catalog.Entry) bool { entries = append(entries, e); return true })
	found, bad := contradicting(entries, sc.found, sc.limit)
	rep.Contradicting = bad
	s.mu.gen, s.mu.genLimit = newestGen(entries, append(slices.Clip(sc.found), sc.beyond...), sc.limit), sc.limit
	var adopt, kept []catalog.Entry
	var drop []pagekey.Key
	for _, ch := range reconcile(entries, found, rep.Scanned) {
		e, ok := s.reserveFirst(ch, sc.mode == ScanHeaders, &rep)
		switch {
		case !ok && ch.inCatalog:
			drop = append(drop, ch.key)
			rep.Dropped++
		case !ok:
		case ch.vouched && e == ch.cands[0]:
			kept = append(kept, e)
			rep.Kept++
		default:
			adopt = append(adopt, e)
			kept = append(kept, e)
			rep.Rebuilt++
		}
	}
	if err := s.cat.Adopt(adopt, drop); err != nil {
		return rep, err
	}
	slices.SortFunc(kept, func(a, b catalog.Entry) int {
		return cmp.Or(cmp.Compare(a.LastAccess, b.LastAccess), cmp.Compare(a.Generation, b.Generation))
	})
	for _, e := range kept {
		s.mu.ssd.Touch(e.Key)
	}
	s.UpdateGauges()
	return rep, nil
}

// newestGen is the newest generation a start must never hand out again:
// the catalog's, and every slot's within limit, left beyond the tier too
// (one above it is nobody's and must not push the generations there).
func newestGen(entries []catalog.Entry, found []ssd.Found, limit uint64) uint64 {
	var gen uint64
	for _, e := range entries {
		gen = max(gen, e.Generation)
	}
	for _, f := range found {
		if !aboveLimit(f, limit) {
			gen = max(gen, f.Header.Generation)
		}
	}
	return gen
}

// reserveFirst reserves the first candidate whose slot the SSD tier takes.
// When verify is set (the scan read headers only) a candidate other than
// the catalog's own vouched entry must also hold its page whole: its data
// is read and checked first, and a torn or damaged one gives way to the
// next, as a full scan would have skipped it. The catalog's vouched
// entries are checked where they are read (the read path verifies every
// byte against the catalog's checksum).
func (s *Store) reserveFirst(ch recoverChoice, verify bool, rep *RecoverReport) (catalog.Entry, bool) {
	if s.ssd == nil {
		return catalog.Entry{}, false
	}
	for i, e := range ch.cands {
		loc := ssdLoc(e.SSD)
		if s.ssd.Reserve(loc) != nil {
			continue
		}
		if verify && (i > 0 || !ch.vouched) {
			rep.Verified++
			if err := s.ssd.VerifySlot(context.Background(), loc, header(e)); err != nil {
				s.ssd.Free(loc)
				rep.Unverifiable++
				continue
			}
		}
		return e, true
	}
	return catalog.Entry{}, false
}
