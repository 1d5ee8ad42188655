package store_test

import (
	"bytes"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/testkit/storetest"
	"github.com/warden-dev/warden/scheduler/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemory(t *testing.T) {
	storetest.Run(t, storetest.Factory{Open: func(*testing.T) store.Store { return store.NewMemory() }})
}

func TestBolt(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		Open: func(t *testing.T) store.Store {
			s, err := store.OpenBolt(filepath.Join(t.TempDir(), "runs.db"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			path := s.(*store.Bolt).Path()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			n, err := store.OpenBolt(path)
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
	})
}

func TestBoltLockedByAnotherOpener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := store.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := store.OpenBolt(path); err == nil || !bytes.Contains([]byte(err.Error()), []byte("locked by another process")) {
		t.Fatalf("second open: %v, want a lock error naming the cause", err)
	}
}

func TestBoltClosed(t *testing.T) {
	s, err := store.OpenBolt(filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	r := &store.Run{Name: "x", Status: store.Queued}
	if _, err := s.Submit(t.Context(), r); err != store.ErrClosed {
		t.Fatalf("Submit after Close: %v", err)
	}
	if _, err := s.Get(t.Context(), 1); err != store.ErrClosed {
		t.Fatalf("Get after Close: %v", err)
	}
}

func TestCodecRoundTrip(t *testing.T) {
	r := store.Run{Name: "sync", Status: store.RetryWait, Priority: -3, Attempt: 2, Key: "acme", Tenant: "t",
		IdempotencyKey: "i", Input: []byte(`{}`), Output: []byte{}, Reason: "HTTP 503", Control: "timeout",
		CreatedAt: 1, QueuedAt: 2, StartedAt: 3, FinishedAt: 4, RetryAt: -5, PoolID: "cap:x", WindowStart: 6}
	var got store.Run
	if err := store.Decode(store.Encode(nil, &r), &got, true); err != nil {
		t.Fatal(err)
	}
	if got.Output == nil || len(got.Output) != 0 {
		t.Fatalf("empty output decoded as %#v, want empty non-nil", got.Output)
	}
	got.Output = r.Output
	if fmtRun(got) != fmtRun(r) {
		t.Fatalf("round trip\n got %s\nwant %s", fmtRun(got), fmtRun(r))
	}
}

func fmtRun(r store.Run) string {
	return string(store.Encode(nil, &r))
}

// FuzzDecode: a corrupt record must be an error, never a panic or a huge
// allocation, and whatever decodes must encode back to a record that
// decodes to the same run.
func FuzzDecode(f *testing.F) {
	r := store.Run{Name: "n", Status: store.Queued, Input: []byte(`{"a":1}`), Key: "k", CreatedAt: 5}
	f.Add(store.Encode(nil, &r))
	f.Add([]byte{1, 1})
	f.Add([]byte{1, 9, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got store.Run
		if err := store.Decode(b, &got, true); err != nil {
			return
		}
		again := store.Encode(nil, &got)
		var back store.Run
		if err := store.Decode(again, &back, true); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !bytes.Equal(store.Encode(nil, &back), again) {
			t.Fatal("decode/encode not stable")
		}
	})
}

func openBolt(t *testing.T) *store.Bolt {
	t.Helper()
	s, err := store.OpenBolt(filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// StartAsync hands back the admitted run before its write is durable;
// the write lands as Start's would, and a write made after it is applied
// after it (an update expecting STARTING succeeds at once).
func TestBoltStartAsync(t *testing.T) {
	s := openBolt(t)
	ctx := t.Context()
	r := &store.Run{Name: "job", Status: store.Queued, Input: []byte(`{"a":1}`), RetryAt: 7}
	if _, err := s.Submit(ctx, r); err != nil {
		t.Fatal(err)
	}
	written := make(chan error, 1)
	got, err := s.StartAsync(ctx, r.Seq, store.Admission{At: 42, PoolID: "p", WindowStart: 40}, func(err error) { written <- err })
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != store.Starting || got.Attempt != 1 || got.StartedAt != 42 || got.RetryAt != 7 || string(got.Input) != `{"a":1}` {
		t.Fatalf("admitted run %+v", got)
	}
	if err := <-written; err != nil {
		t.Fatalf("STARTING write: %v", err)
	}
	stored, err := s.Get(ctx, r.Seq)
	if err != nil || stored.Status != store.Starting || stored.Attempt != 1 || stored.PoolID != "p" || stored.WindowStart != 40 || stored.RetryAt != 0 {
		t.Fatalf("stored %+v, %v", stored, err)
	}

	// Ordering: an update sent right after, before the commit.
	r2 := &store.Run{Name: "job", Status: store.Queued}
	if _, err := s.Submit(ctx, r2); err != nil {
		t.Fatal(err)
	}
	got, err = s.StartAsync(ctx, r2.Seq, store.Admission{At: 43}, func(err error) { written <- err })
	if err != nil {
		t.Fatal(err)
	}
	got.Status, got.FinishedAt = store.Completed, 50
	if err := s.Update(ctx, &got, store.Of(store.Starting)); err != nil {
		t.Fatalf("update after StartAsync: %v (not ordered after the STARTING write)", err)
	}
	if err := <-written; err != nil {
		t.Fatalf("STARTING write: %v", err)
	}
	if _, err := s.StartAsync(ctx, r.Seq, store.Admission{At: 60}, func(error) { t.Error("callback of a refused start") }); err != store.ErrConflict {
		t.Fatalf("StartAsync of a finished run: %v, want ErrConflict", err)
	}
	if _, err := s.StartAsync(ctx, 999, store.Admission{At: 60}, func(error) { t.Error("callback of a refused start") }); err != store.ErrNotFound {
		t.Fatalf("StartAsync of an unknown run: %v, want ErrNotFound", err)
	}
}

// An admission racing another transition of the same run never both
// succeed: either StartAsync refuses at once or its write reports the
// conflict.
func TestBoltStartAsyncRace(t *testing.T) {
	s := openBolt(t)
	ctx := t.Context()
	for i := range 50 {
		r := &store.Run{Name: "job", Status: store.Queued}
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		timedOut := *r
		timedOut.Status = store.TimedOut
		updated := make(chan error, 1)
		go func() { updated <- s.Update(ctx, &timedOut, store.Of(store.Queued)) }()
		written := make(chan error, 1)
		_, err := s.StartAsync(ctx, r.Seq, store.Admission{At: 1}, func(err error) { written <- err })
		if err == nil {
			err = <-written
		}
		uerr := <-updated
		if (err == nil) == (uerr == nil) {
			t.Fatalf("round %d: start %v, update %v: exactly one must win", i, err, uerr)
		}
		for _, e := range []error{err, uerr} {
			if e != nil && e != store.ErrConflict {
				t.Fatalf("round %d: %v, want ErrConflict", i, e)
			}
		}
	}
}

// Close commits a queued STARTING write before it returns.
func TestBoltCloseCommitsQueuedStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := store.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &store.Run{Name: "job", Status: store.Queued}
	if _, err := s.Submit(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	written := make(chan error, 1)
	if _, err := s.StartAsync(t.Context(), r.Seq, store.Admission{At: 1}, func(err error) { written <- err }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	s2, err := store.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got, _ := s2.Get(t.Context(), r.Seq); got.Status != store.Starting || got.Attempt != 1 {
		t.Fatalf("after Close: %s attempt %d, want STARTING attempt 1", got.Status, got.Attempt)
	}
}

// A bbolt file keeps the scope it was created with, and another file gets
// another: run ids built on it never repeat across standalone sidecars or
// a deleted store.
func TestIDScope(t *testing.T) {
	dir := t.TempDir()
	open := func(name string) *store.Bolt {
		s, err := store.OpenBolt(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := open("a.db")
	scope := a.IDScope()
	if len(scope) != 12 {
		t.Fatalf("scope %q, want 12 hex digits", scope)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = open("a.db")
	defer a.Close()
	b := open("b.db")
	defer b.Close()
	m1, m2 := store.NewMemory(), store.NewMemory()
	defer m1.Close()
	defer m2.Close()
	tests := []struct {
		name  string
		a, b  string
		equal bool
	}{
		{"reopened file", a.IDScope(), scope, true},
		{"two files", a.IDScope(), b.IDScope(), false},
		{"two memory stores", m1.IDScope(), m2.IDScope(), false},
	}
	for _, tt := range tests {
		if (tt.a == tt.b) != tt.equal || tt.a == "" {
			t.Errorf("%s: scopes %q and %q, want equal %v", tt.name, tt.a, tt.b, tt.equal)
		}
	}
	var _ store.IDScoper = a
	var _ store.IDScoper = m1
}

// A file written before stores had scopes (no scope in its meta bucket)
// gets one at its next open and keeps its runs.
func TestIDScopeAddedToAnOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := store.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &store.Run{Name: "job", Status: store.Queued, Input: []byte(`{}`)}
	if _, err := s.Submit(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Delete([]byte("scope")) })
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatalf("strip the scope: %v %v", err, cerr)
	}
	s, err = store.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.IDScope()) != 12 {
		t.Fatalf("scope %q after opening an older file, want a new one", s.IDScope())
	}
	if got, err := s.Get(t.Context(), r.Seq); err != nil || got.Name != "job" {
		t.Fatalf("the older file's run: %+v %v", got, err)
	}
}
