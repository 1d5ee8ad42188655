// Package pgtest gives a test a schema of its own in the test database
// (internal/testenv.PostgresURL), so parallel tests and reruns of the
// Postgres run store never see each other's rows.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/internal/testkit/testenv"
)

// SchemaURL returns the test database's URL with search_path set to a
// fresh schema named prefix_<random>, which is dropped when the test ends.
// The schema itself is created by the store's migrations.
func SchemaURL(t testing.TB, prefix string) *url.URL {
	t.Helper()
	base := testenv.PostgresURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := prefix + "_" + hex.EncodeToString(b)
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
			t.Errorf("drop test schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	return u
}
