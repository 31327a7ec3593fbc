package store

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// Generation limit (issue 34, finding 1): the most a slot header's
// generation can be if this store wrote it. A start takes a header whose
// generation is newer than the catalog's record as a save whose commit the
// catalog lost; one above the limit is nobody's save, so it is dropped as a
// contradicting slot (recover.go), never adopted.
//
// Why every header the store wrote is within the limit recorded on disk,
// after a kill -9 too: a generation is handed out (nextGen) only once a
// limit at or above it is durable in genLimitName, in the SSD directory
// (a temporary file synced, renamed, the directory synced); the slot
// header carrying it is written after that. A save acknowledged as durable
// had its slot written and fdatasynced (ssd.SyncBatch), then its catalog record
// committed with sync, so it is named by the catalog and within the limit;
// one that reached the SSD but not the catalog before a crash was never
// acknowledged, and its generation too was within the limit when handed
// out. The limit is a file of its own, not a catalog record, so that it
// survives what recovery rebuilds the catalog for (a damaged store, a lost
// WAL tail): it only ever grows, genBlock at a time, so a lost update
// would leave a smaller limit than generations already handed out.
//
// What it cannot tell: a forgery within genBlock above the newest
// generation handed out looks like a lost commit. Without a readable file
// (a tier older than it, or the file lost) the limit is unknown and newer
// generations are taken as before. A limit that cannot be written (a full
// disk) does not stop saves: generations go on being handed out, the write
// is retried at each, and a page written meanwhile is kept where the
// catalog's record vouches for it.

// genLimitName is the limit's file in the SSD directory.
const genLimitName = "generation-limit"

// genRetryEvery is how many generations pass between tries to record a
// limit after a failed write.
const genRetryEvery = 1024

// genBlock is how many generations one durable write of the limit covers:
// one small file synced, renamed and its directory synced, under the
// store's lock, per 65,536 generations handed out (saves to DRAM count).
const genBlock = 1 << 16

const genLimitFormat = "orbitkv generation limit v1\nlimit %d\n"

// readGenLimit returns the limit recorded in dir; ok is false when there
// is none or it does not read back whole.
func readGenLimit(dir string) (limit uint64, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, genLimitName))
	if err != nil {
		return 0, false
	}
	var crc uint32
	n, _ := fmt.Sscanf(string(b), genLimitFormat+"crc %08x\n", &limit, &crc)
	body := fmt.Sprintf(genLimitFormat, limit)
	if n != 2 || string(b) != body+fmt.Sprintf("crc %08x\n", crc32.ChecksumIEEE([]byte(body))) {
		return 0, false
	}
	return limit, true
}

// writeGenLimit records limit in dir durably (writeDurably).
func writeGenLimit(dir string, limit uint64) error {
	body := fmt.Sprintf(genLimitFormat, limit)
	body += fmt.Sprintf("crc %08x\n", crc32.ChecksumIEEE([]byte(body)))
	if err := writeDurably(dir, genLimitName, body); err != nil {
		return fmt.Errorf("record generation limit: %w", err)
	}
	return nil
}

// writeDurably writes body as dir/name: a temporary file synced, renamed
// into place, the directory synced. A reader sees the old file or the
// whole new one; on error the temporary file is removed.
func writeDurably(dir, name, body string) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(body)
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// syncDir makes dir's entries (a rename, a removal) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// nextGen returns a fresh generation number, first making a limit that
// covers it durable when it passes the recorded one.
func (s *Store) nextGen() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.gen++
	if s.mu.gen > s.mu.genLimit && s.mu.gen >= s.mu.genLimitRetry {
		s.raiseGenLimitLocked()
	}
	return s.mu.gen
}

// raiseGenLimitLocked records genBlock generations past the one being
// handed out. Without an SSD tier no header needs bounding; a failed write
// is logged once and tried again genRetryEvery generations later (a failing
// disk must not add a synced write to every save under the store lock).
func (s *Store) raiseGenLimitLocked() {
	if s.ssd == nil || s.opts.SSDDir == "" {
		s.mu.genLimit = ^uint64(0)
		return
	}
	limit := s.mu.gen + genBlock
	if err := writeGenLimit(s.opts.SSDDir, limit); err != nil {
		if !s.mu.genLimitFailed {
			s.log.Warn().Err(err).Msg("generation limit not recorded: after a crash, pages written meanwhile that the catalog does not name are dropped, not rebuilt; retrying")
		}
		s.mu.genLimitFailed, s.mu.genLimitRetry = true, s.mu.gen+genRetryEvery
		return
	}
	s.mu.genLimit, s.mu.genLimitFailed = limit, false
}
