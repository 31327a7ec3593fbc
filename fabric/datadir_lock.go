package fabric

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// lockFileName is the data dir's lock: the pid of the peer that holds it.
const lockFileName = "orbitkv.lock"

// ErrDataDirInUse reports a data dir another live peer holds; the error
// returned is a *DataDirInUseError, which names the holder.
var ErrDataDirInUse = errors.New("data dir is in use")

// DataDirInUseError names the data dir and the pid its lock file holds.
type DataDirInUseError struct{ Dir, Pid, Lock string }

func (e *DataDirInUseError) Error() string {
	return fmt.Sprintf("data dir %s is in use by pid %s (it holds %s)", e.Dir, e.Pid, e.Lock)
}

// Is makes errors.Is(err, ErrDataDirInUse) hold.
func (e *DataDirInUseError) Is(target error) bool { return target == ErrDataDirInUse }

// dirLock is an exclusive flock(2) on DataDir/orbitkv.lock, taken before
// anything else in the data dir is opened: two peers on one data dir would
// otherwise race for the catalog's store (the loser took Pebble's lock
// failure for a damaged catalog and moved the live one aside). The kernel
// drops the lock when the process dies, so a stale file never blocks a
// start; the pid in it is only for the message.
type dirLock struct{ f *os.File }

// lockDataDir takes the data dir's lock without waiting, or says which pid
// holds it.
func lockDataDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open data dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := readPid(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &DataDirInUseError{Dir: dir, Pid: holder, Lock: path}
		}
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	if err := writePid(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("write data dir lock %s: %w", path, err)
	}
	return &dirLock{f: f}, nil
}

func readPid(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid := string(bytes.TrimSpace(b[:n])); pid != "" {
		return pid
	}
	return "unknown"
}

func writePid(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// release drops the lock; nil-safe and idempotent. The file stays: removing
// it would let a third peer lock a new file while a second waits on the old.
func (l *dirLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}
