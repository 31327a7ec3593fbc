package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// Clean-shutdown marker (issue 34, finding 2). A start that cannot trust
// the catalog checks it against the SSD page files (fabric/store/recover.go);
// after a clean stop there is nothing to check, and reading a large tier
// would delay serving by its size. Close writes cleanMarkerName into the
// data dir once the catalog and the page files are closed with nothing in
// flight; it records the catalog's SSD entries (their count and a digest of
// what each names: key, layout, length, checksum, generation, slot). New
// takes the marker away (removed, the directory synced) before anything is
// written, so a peer that then dies leaves none, and skips the scan only
// when the marker was there, reads back whole, matches the catalog it
// opened (undamaged) and every page file of the tier existed before the
// start. Anything else scans: headers only when the catalog is intact,
// the whole files when it was damaged (startScan).

const cleanMarkerName = "clean-shutdown"

// cleanMarker is what a clean stop recorded of the catalog's SSD entries.
type cleanMarker struct {
	entries int
	digest  uint64
}

const cleanMarkerFormat = "orbitkv clean shutdown v1\nssd_entries %d\ndigest %016x\n"

// catalogDigest is the count and an order-free digest of cat's SSD entries:
// the sum of a hash of each entry's key, layout, length, checksum,
// generation and slot (not its access time or hits, which change without
// a synced commit).
func catalogDigest(cat *catalog.Catalog) cleanMarker {
	var m cleanMarker
	var b []byte
	cat.Range(func(e catalog.Entry) bool {
		if !e.OnSSD {
			return true
		}
		b = append(b[:0], e.Key[:]...)
		b = append(b, e.Layout[:]...)
		b = binary.LittleEndian.AppendUint64(b, e.Size)
		b = binary.LittleEndian.AppendUint32(b, e.Checksum)
		b = binary.LittleEndian.AppendUint64(b, e.Generation)
		b = binary.LittleEndian.AppendUint32(b, e.SSD.File)
		b = binary.LittleEndian.AppendUint64(b, e.SSD.Offset)
		b = binary.LittleEndian.AppendUint64(b, e.SSD.Bytes)
		h := fnv.New64a()
		h.Write(b)
		m.entries++
		m.digest += h.Sum64()
		return true
	})
	return m
}

// writeCleanMarker writes m into dir durably: a temporary file synced,
// renamed into place, the directory synced.
func writeCleanMarker(dir string, m cleanMarker) error {
	body := fmt.Sprintf(cleanMarkerFormat, m.entries, m.digest)
	body += fmt.Sprintf("crc %08x\n", crc32.ChecksumIEEE([]byte(body)))
	tmp := filepath.Join(dir, cleanMarkerName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(body)
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, cleanMarkerName))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// takeCleanMarker reads and removes dir's marker: ok when one was there and
// read back whole. The removal reaches the disk before it returns, so a
// start that dies later leaves no marker behind.
func takeCleanMarker(dir string) (m cleanMarker, ok bool, err error) {
	path := filepath.Join(dir, cleanMarkerName)
	b, rerr := os.ReadFile(path)
	if errors.Is(rerr, os.ErrNotExist) {
		return m, false, nil
	}
	if err := os.Remove(path); err != nil {
		return m, false, fmt.Errorf("remove the clean-shutdown marker: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return m, false, fmt.Errorf("remove the clean-shutdown marker: %w", err)
	}
	if rerr != nil {
		return m, false, nil // unreadable: scan
	}
	var crc uint32
	n, _ := fmt.Sscanf(string(b), cleanMarkerFormat+"crc %08x\n", &m.entries, &m.digest, &crc)
	body := fmt.Sprintf(cleanMarkerFormat, m.entries, m.digest)
	if n != 3 || crc != crc32.ChecksumIEEE([]byte(body)) || string(b) != body+fmt.Sprintf("crc %08x\n", crc) {
		return cleanMarker{}, false, nil
	}
	return m, true, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// startScan decides how this start checks the catalog against the SSD page
// files of tier (nil: no SSD tier): existing are the page files that were
// there before it opened the tier, marker and marked what takeCleanMarker
// found.
func startScan(cat *catalog.Catalog, tier *ssd.Store, marker cleanMarker, marked bool, existing []int) (store.ScanMode, string) {
	if tier == nil {
		return store.ScanNone, "no ssd tier"
	}
	damaged := cat.Stats().Damage.Reason != ""
	m := catalogDigest(cat)
	all := true
	for i := range tier.Files() {
		all = all && slices.Contains(existing, i)
	}
	switch {
	case damaged && len(existing) > 0:
		return store.ScanFull, "catalog damaged: rebuilt from the whole page files"
	case marked && !damaged && all && m == marker:
		return store.ScanNone, "clean shutdown"
	case len(existing) == 0 && m.entries == 0:
		return store.ScanNone, "new ssd tier"
	case !marked:
		return store.ScanHeaders, "no clean-shutdown marker"
	case !all:
		return store.ScanHeaders, "page files missing"
	}
	return store.ScanHeaders, "catalog differs from the clean shutdown's"
}

// pageFilesIn lists the page file numbers in dir's ssd directory.
func pageFilesIn(dataDir string) ([]int, error) { return ssd.PageFiles(filepath.Join(dataDir, "ssd")) }
