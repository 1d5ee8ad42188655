package app

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestWatchFile changes a policy file the ways editors, deploy scripts and
// Kubernetes do, and waits for each change to be reported. Where a step
// lists watched directories, the watch must be on exactly those then (a
// directory no longer on the way to the file is let go).
func TestWatchFile(t *testing.T) {
	type step struct {
		do      func(t *testing.T, dir string)
		watched []string // relative to dir; nil: not checked
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the --policy path
		steps []step
	}{
		{
			name:  "file written in place",
			setup: func(t *testing.T, dir string) string { return write(t, dir, "p/policy.yaml") },
			steps: []step{{do: edit("p/policy.yaml"), watched: []string{"p"}}},
		},
		{
			name:  "file replaced by a rename",
			setup: func(t *testing.T, dir string) string { return write(t, dir, "p/policy.yaml") },
			steps: []step{{do: replace("p/policy.yaml")}},
		},
		{
			name: "symlink to another directory, target edited in place",
			setup: func(t *testing.T, dir string) string {
				write(t, dir, "real/a.yaml")
				return link(t, dir, "r3/policy.yaml", "../real/a.yaml")
			},
			steps: []step{{do: edit("real/a.yaml"), watched: []string{"r3", "real"}}},
		},
		{
			name: "symlink to another directory, target replaced by a rename",
			setup: func(t *testing.T, dir string) string {
				write(t, dir, "real/a.yaml")
				return link(t, dir, "r3/policy.yaml", filepath.Join(dir, "real/a.yaml"))
			},
			steps: []step{{do: replace("real/a.yaml")}, {do: edit("real/a.yaml")}},
		},
		{
			name: "symlink swapped, then the new target edited",
			setup: func(t *testing.T, dir string) string {
				write(t, dir, "real/a.yaml")
				write(t, dir, "other/b.yaml")
				return link(t, dir, "r3/policy.yaml", "../real/a.yaml")
			},
			steps: []step{
				{do: swapLink("r3/policy.yaml", "../other/b.yaml"), watched: []string{"r3", "other"}},
				{do: edit("other/b.yaml"), watched: []string{"r3", "other"}},
			},
		},
		{
			name: "chain of symlinks, the middle one swapped",
			setup: func(t *testing.T, dir string) string {
				write(t, dir, "real/a.yaml")
				write(t, dir, "other/b.yaml")
				link(t, dir, "mid/current.yaml", "../real/a.yaml")
				return link(t, dir, "r3/policy.yaml", "../mid/current.yaml")
			},
			steps: []step{
				{do: edit("real/a.yaml"), watched: []string{"r3", "mid", "real"}},
				{do: swapLink("mid/current.yaml", "../other/b.yaml"), watched: []string{"r3", "mid", "other"}},
				{do: edit("other/b.yaml")},
			},
		},
		{
			name: "kubernetes ..data swap",
			setup: func(t *testing.T, dir string) string {
				write(t, dir, "cm/..v1/policy.yaml")
				link(t, dir, "cm/..data", "..v1")
				return link(t, dir, "cm/policy.yaml", "..data/policy.yaml")
			},
			steps: []step{
				{do: func(t *testing.T, dir string) {
					// The kubelet's atomic writer: a new timestamped
					// directory, ..data swapped to it, the old one removed.
					write(t, dir, "cm/..v2/policy.yaml")
					swapLink("cm/..data", "..v2")(t, dir)
					if err := os.RemoveAll(filepath.Join(dir, "cm/..v1")); err != nil {
						t.Fatal(err)
					}
				}, watched: []string{"cm", "cm/..v2"}},
				{do: edit("cm/..v2/policy.yaml")},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			path := tc.setup(t, dir)
			fw, err := watchFile(path, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer fw.Close()
			for i, s := range tc.steps {
				s.do(t, dir)
				select {
				case <-fw.Changed():
				case <-time.After(10 * time.Second):
					t.Fatalf("step %d: no change reported within 10s", i+1)
				}
				if s.watched == nil {
					continue
				}
				var want []string
				for _, w := range s.watched {
					want = append(want, filepath.Join(dir, w))
				}
				got := fw.w.WatchList()
				slices.Sort(want)
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Errorf("step %d: watching %q, want %q", i+1, got, want)
				}
			}
		})
	}
}

// write creates dir/rel (and its directory) holding a small policy, and
// returns its path.
func write(t *testing.T, dir, rel string) string {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("version: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// link creates the symlink dir/rel pointing at target and returns its path.
func link(t *testing.T, dir, rel, target string) string {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// edit rewrites dir/rel in place, as `echo >>` or an editor saving in place
// does.
func edit(rel string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, rel), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("# edited\n"); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// replace writes a new dir/rel beside it and renames it over, as `sed -i`
// and most editors do.
func replace(rel string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.WriteFile(p+".tmp", []byte("version: 1\n# replaced\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
}

// swapLink points the symlink dir/rel at target atomically: a new link
// renamed over the old one.
func swapLink(rel, target string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.Symlink(target, p+".tmp"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
}
