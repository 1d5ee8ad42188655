package pgstore_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/testkit/pgtest"
	"github.com/warden-dev/warden/internal/testkit/storetest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// schemaURL returns the test database's URL with a fresh schema of its own
// in search_path, dropped when the test ends.
func schemaURL(t *testing.T) string { return pgtest.SchemaURL(t, "warden_test").String() }

func open(t testing.TB, u string) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := pgstore.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		Open: func(t *testing.T) store.Store { return open(t, schemaURL(t)) },
		Reopen: func(t *testing.T, s store.Store) store.Store {
			schema := s.(*pgstore.Store).Schema()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(testenv.PostgresURL(t))
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return open(t, u.String())
		},
	})
}

// An unquoted search_path names the schema the server folds it to: the
// store creates and uses that one.
func TestOpenFoldsUnquotedSchema(t *testing.T) {
	u := pgtest.SchemaURL(t, "warden_test") // dropped by its lower-case name
	q := u.Query()
	schema := q.Get("search_path")
	q.Set("search_path", strings.ToUpper(schema)+", public")
	u.RawQuery = q.Encode()
	s := open(t, u.String())
	defer s.Close()
	if s.Schema() != schema {
		t.Fatalf("store schema %q, want %q", s.Schema(), schema)
	}
	if _, err := s.Submit(context.Background(), &store.Run{Name: "job", Status: store.Queued}); err != nil {
		t.Fatal(err)
	}
}
