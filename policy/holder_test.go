package policy

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestHolderSwap(t *testing.T) {
	a := mustParse(t, "version: 1\n")
	b := mustParse(t, "version: 1\nshutdown_grace: 1s\n")
	h := NewHolder(a)
	if h.Load() != a {
		t.Fatal("Load did not return the initial policy")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if p := h.Load(); p != a && p != b {
					t.Error("Load returned a policy never stored")
					return
				}
			}
		}()
	}
	if old := h.Swap(b); old != a {
		t.Error("Swap did not return the previous policy")
	}
	wg.Wait()
	if h.Load() != b {
		t.Error("Load after Swap")
	}
}

func TestHolderReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("version: 1\n")
	first, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHolder(first)

	// Unchanged bytes keep the running policy.
	if p, err := h.Reload(path); err != nil || p != first || h.Load() != first {
		t.Errorf("reload of unchanged file: %v, %v", p == first, err)
	}
	// An invalid file keeps the running policy and reports why.
	write("version: 1\nshutdown_grace: 5\n")
	if p, err := h.Reload(path); err == nil || p != first || h.Load() != first {
		t.Errorf("invalid reload: err=%v, kept=%v", err, h.Load() == first)
	}
	// A valid change is swapped in.
	write("version: 1\nshutdown_grace: 5s\n")
	p, err := h.Reload(path)
	if err != nil || p == first || h.Load() != p || p.ShutdownGrace.String() != "5s" {
		t.Errorf("valid reload: err=%v", err)
	}
}
