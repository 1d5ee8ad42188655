package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/testenv"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
	"github.com/warden-dev/warden/scheduler/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// schemaURL returns the test database's URL with a fresh schema of its own
// in search_path, dropped when the test ends, so parallel tests and reruns
// never see each other's rows.
func schemaURL(t *testing.T) string {
	t.Helper()
	base := testenv.PostgresURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "warden_test_" + hex.EncodeToString(b)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop test schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop test schema: %v", err)
		}
	})
	return u.String()
}

func open(t *testing.T, u string) *pgstore.Store {
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
