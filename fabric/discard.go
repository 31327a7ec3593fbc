package fabric

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// errWouldDiscard reports a start whose configuration would drop stored
// pages: the SSD tier is disabled or smaller than the files that hold them.
var errWouldDiscard = errors.New("the configuration would discard stored pages")

// fitSSDTier compares the catalog's SSD pages with the configured SSD tier.
// Pages the tier no longer covers (--ssd-bytes 0 or smaller, other
// --ssd-file-bytes) refuse the start unless --ssd-discard is given; with
// it they leave the catalog and the files beyond the tier are removed (the
// kept ones trimmed to their size), and it says how many went. Nothing is
// changed when the start is refused.
func (p *Peer) fitSSDTier() error {
	dir := filepath.Join(p.cfg.DataDir, "ssd")
	files := 0
	if p.ssd != nil {
		files = p.ssd.Files()
	}
	stray, err := ssd.Stray(dir, files)
	if err != nil {
		return err
	}
	keys, bytes := p.pagesOutsideSSD()
	switch {
	case len(keys) == 0 && len(stray) == 0:
		return nil
	case !p.cfg.SSDDiscard && len(keys) > 0:
		return fmt.Errorf("%w: %d pages (%d bytes) are stored in %s beyond the configured SSD tier (--ssd-bytes %v, --ssd-file-bytes %v): "+
			"restart with the sizes they were written under to keep them, or with --ssd-discard to drop them and remove their files",
			errWouldDiscard, len(keys), bytes, dir, p.cfg.SSDBytes, p.cfg.SSDFileBytes)
	case !p.cfg.SSDDiscard:
		p.log.Warn().Strs("files", stray).Msg("ssd page files beyond the configured tier hold no catalogued pages; left in place (--ssd-discard removes them)")
		return nil
	}
	return p.discardSSD(keys, stray)
}

// discardSSD drops keys from the catalog, then removes the stray files and
// trims the kept ones: the catalog never names a slot whose bytes are gone.
func (p *Peer) discardSSD(keys []pagekey.Key, stray []string) error {
	if len(keys) > 0 {
		if err := p.cat.Delete(keys...); err != nil {
			return fmt.Errorf("discard %d ssd pages: %w", len(keys), err)
		}
	}
	for _, f := range stray {
		if err := os.Remove(f); err != nil {
			return fmt.Errorf("discard ssd file: %w", err)
		}
	}
	if p.ssd != nil {
		if err := p.ssd.Trim(); err != nil {
			return fmt.Errorf("discard ssd file tails: %w", err)
		}
	} else {
		_ = os.Remove(filepath.Join(p.cfg.DataDir, "ssd")) // only if empty
	}
	p.log.Warn().Int("discarded_pages", len(keys)).Strs("removed_files", stray).
		Msg("--ssd-discard: dropped the ssd pages the configured tier no longer holds")
	return nil
}

// pagesOutsideSSD lists the catalog's SSD pages whose slots lie outside the
// configured SSD tier, and their bytes.
func (p *Peer) pagesOutsideSSD() ([]pagekey.Key, uint64) {
	var keys []pagekey.Key
	var n uint64
	p.cat.Range(func(e catalog.Entry) bool {
		if e.OnSSD && (p.ssd == nil || !p.ssd.Holds(ssdLoc(e.SSD))) {
			keys = append(keys, e.Key)
			n += e.Size
		}
		return true
	})
	return keys, n
}
