package app

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// fileWatch reports changes of one file. It watches the file's directory,
// because editors and config-map updates replace a file (rename or symlink
// swap) rather than write it in place, which a watch on the file itself
// would miss after the first replacement.
type fileWatch struct {
	w       *fsnotify.Watcher
	changed chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

// debounce folds the burst of events one save produces into one reload.
const debounce = 100 * time.Millisecond

func watchFile(path string, log *slog.Logger) (*fileWatch, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch %s: %w", filepath.Dir(abs), err)
	}
	fw := &fileWatch{w: w, changed: make(chan struct{}, 1), done: make(chan struct{})}
	fw.wg.Add(1)
	go fw.loop(abs, log)
	return fw, nil
}

func (fw *fileWatch) loop(abs string, log *slog.Logger) {
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
			// Kubernetes swaps a ConfigMap's files by replacing the
			// "..data" symlink, so a change there is a change of the file.
			name := filepath.Clean(ev.Name)
			if (name != abs && filepath.Base(name) != "..data") || ev.Op == fsnotify.Chmod {
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
			log.Warn("policy file watch error", "err", err)
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
