package scheduler

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// With a shared store a sidecar's runs are recorded under its owner id.
// The id belongs to the sidecar, not to one process: a sidecar restarted
// on the same data directory must find the runs its worker accepted
// before the restart (README, Durability), so the id is generated once,
// kept in the data directory and read back at every start. A lock on the
// directory, held while the scheduler runs, keeps two live processes from
// ever sharing an id (as runs.db's own lock does with the bbolt store).
const (
	// SidecarIDFile holds this sidecar's owner id in the data directory.
	SidecarIDFile = "sidecar-id"
	// SidecarLockFile is locked (flock) while a scheduler on a shared
	// store uses the data directory.
	SidecarLockFile = "sidecar.lock"
)

// lockTimeout is how long a start waits for the data directory's lock, as
// long as the bbolt store waits for runs.db's.
const lockTimeout = time.Second

// errLocked is what tryLock reports when another open file holds the lock.
var errLocked = errors.New("locked")

// sidecarOwner locks dir and returns the owner id kept there, creating it
// on the first start. release unlocks the directory.
func sidecarOwner(dir string) (owner string, release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("create data directory: %w", err)
	}
	lockPath := filepath.Join(dir, SidecarLockFile)
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", nil, fmt.Errorf("open %s: %w", lockPath, err)
	}
	for deadline := time.Now().Add(lockTimeout); ; {
		err = tryLock(f)
		if err == nil {
			break
		}
		if !errors.Is(err, errLocked) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, errLocked) {
				return "", nil, fmt.Errorf("data directory %s: locked by another process (is another warden using this --data-dir?): two sidecars sharing the run queue need a data directory each", dir)
			}
			return "", nil, fmt.Errorf("lock %s: %w", lockPath, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	release = func() { f.Close() } // closing the file releases the lock
	owner, err = readOrCreateID(dir)
	if err != nil {
		release()
		return "", nil, err
	}
	return owner, release, nil
}

// readOrCreateID reads dir's sidecar id, or writes a new one atomically
// (a temporary file synced, then renamed) when there is none. The caller
// holds the directory's lock.
func readOrCreateID(dir string) (string, error) {
	path := filepath.Join(dir, SidecarIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if id == "" || strings.ContainsAny(id, " \t\r\n") {
			return "", fmt.Errorf("%s: not a sidecar id (%q); remove the file to have a new one generated", path, string(b))
		}
		return id, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read sidecar id: %w", err)
	}
	id := newOwner()
	tmp, err := os.CreateTemp(dir, SidecarIDFile+".tmp*")
	if err != nil {
		return "", fmt.Errorf("write sidecar id: %w", err)
	}
	_, err = tmp.WriteString(id + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("write sidecar id %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the rename itself is durable
		d.Close()
	}
	return id, nil
}

// newOwner is a new owner id: the host name and a random suffix.
func newOwner() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "sidecar"
	}
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, host)
	b := make([]byte, 6)
	rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}
