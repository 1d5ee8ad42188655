package store_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/storetest"
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
