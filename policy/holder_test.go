package policy

import (
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
