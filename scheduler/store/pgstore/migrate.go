package pgstore

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The schema is versioned SQL kept beside the code: migrations/NNNN_*.sql,
// applied in order, each in its own transaction that also records its
// version in schema_migrations.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations() ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, path := range names {
		base := strings.TrimPrefix(path, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and an underscore", base)
		}
		body, err := migrationFiles.ReadFile(path)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: base, sql: string(body)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", out[i-1].name, out[i].name, out[i].version)
		}
	}
	return out, nil
}

// lockKey is the advisory lock key for one purpose within one schema, so
// that stores in different schemas of one database never wait for each
// other.
func lockKey(schema, purpose string) int64 {
	h := fnv.New64a()
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(purpose))
	return int64(h.Sum64())
}

// migrate creates the schema (when the URL names one) and applies the
// migrations it lacks. A session-level advisory lock serialises starters:
// three sidecars starting together apply each migration once, and the
// others find it recorded.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Release()
	key := lockKey(schema, "migrate")
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	defer func() {
		// A failed unlock leaves the lock with the session; the pool's
		// connection is then closed so the session, and its lock, end.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
			conn.Conn().Close(uctx)
		}
	}()
	if schema != "" {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	for _, v := range versions {
		applied[int(v)] = true
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply migration %s: %w", m.name, err)
		}
	}
	return nil
}

// MigrationCount is how many migrations this build carries.
func MigrationCount() int {
	ms, _ := loadMigrations()
	return len(ms)
}
