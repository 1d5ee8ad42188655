package scheduler

import "testing"

// Two standalone sidecars both count their runs from 1; their run ids,
// which workers key their idempotency by, must still differ. Each id
// resolves on the sidecar that made it, as does the bare sequence that ids
// were before scopes, and an id of another store names no run.
func TestRunIDsDifferAcrossStandaloneSidecars(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return 200, `{}` })
	yaml := policyYAML(w.srv.URL, `
  definitions:
    job: {}`, "")
	h1 := newHarness(t, yaml, withDataDir(t.TempDir()))
	h2 := newHarness(t, yaml, withDataDir(t.TempDir()))
	a, b := h1.submit(`{"name":"job"}`), h2.submit(`{"name":"job"}`)
	if mustSeq(a.ID) != 1 || mustSeq(b.ID) != 1 {
		t.Fatalf("ids %s and %s: want each sidecar's first run", a.ID, b.ID)
	}
	scopeA, _ := idParts(a.ID)
	if a.ID == b.ID || scopeA == "" {
		t.Fatalf("both sidecars' first run has id %s / %s: want ids scoped to their stores", a.ID, b.ID)
	}
	seen := map[string]bool{}
	for range 2 {
		seen[w.next(t).id] = true
	}
	if !seen[a.ID] || !seen[b.ID] {
		t.Fatalf("worker saw x-run-id %v, want %s and %s", seen, a.ID, b.ID)
	}
	h1.waitStatus(a.ID, "COMPLETED")
	tests := []struct {
		name, path string
		code       int
	}{
		{"scoped id", "/" + a.ID, 200},
		{"bare sequence", "/1", 200},
		{"another store's id", "/" + b.ID, 404},
		{"unknown sequence in this scope", "/" + scopeA + "-7", 404},
		{"empty scope", "/-1", 404},
		{"list after the scoped id", "?after=" + a.ID, 200},
		{"list after a bare sequence", "?after=1", 200},
		{"list after another store's id", "?after=" + b.ID, 400},
	}
	for _, tt := range tests {
		if r := h1.do("GET", tt.path, ""); r.code != tt.code {
			t.Errorf("%s: GET %s = %d %s, want %d", tt.name, tt.path, r.code, r.body, tt.code)
		}
	}
	if v := h1.get("1"); v.ID != a.ID {
		t.Fatalf("GET by bare sequence answers id %s, want %s", v.ID, a.ID)
	}
}
