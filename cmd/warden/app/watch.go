package app

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// fileWatch reports changes of one file. It watches directories, not the
// file, because editors and config-map updates replace a file (rename or
// symlink swap) rather than write it in place, which a watch on the file
// itself would miss after the first replacement.
//
// When the path is a symlink, the file read is elsewhere: the watch is on
// the directory of every link on the way and of the file they end at, and
// follows a swap of any of them (the symlink itself, a link in the middle,
// Kubernetes' ..data) to the directories of the new chain.
type fileWatch struct {
	w       *fsnotify.Watcher
	abs     string
	log     *slog.Logger
	changed chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	// Owned by loop once it runs.
	names  map[string]bool // the paths on the chain, as events name them
	dirs   map[string]bool // their directories, watched
	failed map[string]bool // directories that could not be watched, warned about
}

// debounce folds the burst of events one save produces into one reload.
const debounce = 100 * time.Millisecond

// maxLinks bounds a chain of symlinks, as the kernel does (ELOOP).
const maxLinks = 40

func watchFile(path string, log *slog.Logger) (*fileWatch, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	fw := &fileWatch{w: w, abs: abs, log: log, changed: make(chan struct{}, 1), done: make(chan struct{}),
		dirs: map[string]bool{}, failed: map[string]bool{}}
	names := linkChain(abs)
	// The directory of the path itself must be watched: without it no
	// change, not even a swap of the link, would be seen.
	if err := w.Add(filepath.Dir(names[0])); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch %s: %w", filepath.Dir(abs), err)
	}
	fw.dirs[filepath.Dir(names[0])] = true
	fw.follow(names)
	fw.wg.Add(1)
	go fw.loop()
	return fw, nil
}

// linkChain lists the paths from abs to the file its symlinks end at: abs,
// then each link's target. Each path has its directory's own symlinks
// resolved, since that is the directory a watch lands on and the name its
// events carry. The chain stops at a file that is not a symlink, or that
// does not exist (mid-swap), or after maxLinks.
func linkChain(abs string) []string {
	var names []string
	p := abs
	for range maxLinks {
		dir := filepath.Dir(p)
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		p = filepath.Join(dir, filepath.Base(p))
		names = append(names, p)
		target, err := os.Readlink(p)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		p = target
	}
	return names
}

// follow makes names the chain watched: the directories it needs are
// added, those it no longer needs removed.
func (fw *fileWatch) follow(names []string) {
	fw.names = make(map[string]bool, len(names))
	want := make(map[string]bool, len(names))
	for _, n := range names {
		fw.names[n] = true
		want[filepath.Dir(n)] = true
	}
	for d := range want {
		if fw.dirs[d] {
			continue
		}
		if err := fw.w.Add(d); err != nil {
			// Retried on every event (the directory may be on its way),
			// warned about once.
			if !fw.failed[d] {
				fw.failed[d] = true
				fw.log.Warn("policy file watch: cannot watch a directory on the way to the file; changes there are missed", "dir", d, "err", err)
			}
			continue
		}
		delete(fw.failed, d)
		fw.dirs[d] = true
	}
	for d := range fw.dirs {
		if !want[d] {
			// A directory that was deleted (Kubernetes' old ..timestamp)
			// is no longer watched anyway; nothing to report.
			_ = fw.w.Remove(d)
			delete(fw.dirs, d)
		}
	}
}

// relevant reports whether an event on name may change the file read.
// Kubernetes swaps a ConfigMap's files by replacing the "..data" symlink,
// a directory on the way to the file rather than a file on the chain.
func (fw *fileWatch) relevant(name string) bool {
	return fw.names[name] || filepath.Base(name) == "..data"
}

func (fw *fileWatch) loop() {
	defer fw.wg.Done()
	var fire <-chan time.Time
	var t *time.Timer
	for {
		select {
		case <-fw.done:
			if t != nil {
				t.Stop()
			}
			return
		case ev, ok := <-fw.w.Events:
			if !ok {
				return
			}
			name := filepath.Clean(ev.Name)
			hit := fw.relevant(name)
			// Any event may follow a swap that moved the chain: resolve
			// it again, then ask once more (an event in the new target's
			// directory is one on the new chain).
			fw.follow(linkChain(fw.abs))
			hit = hit || fw.relevant(name)
			if !hit || ev.Op == fsnotify.Chmod {
				continue
			}
			if t == nil {
				t = time.NewTimer(debounce)
			} else {
				t.Reset(debounce)
			}
			fire = t.C
		case err, ok := <-fw.w.Errors:
			if !ok {
				return
			}
			fw.log.Warn("policy file watch error", "err", err)
		case <-fire:
			fire = nil
			select {
			case fw.changed <- struct{}{}:
			default:
			}
		}
	}
}

// Changed delivers once per burst of changes.
func (fw *fileWatch) Changed() <-chan struct{} { return fw.changed }

// Close stops watching.
func (fw *fileWatch) Close() error {
	close(fw.done)
	err := fw.w.Close()
	fw.wg.Wait()
	return err
}
