// Package testenv finds the real services tests run against: PostgreSQL and
// Redis on loopback. Outside CI a test whose service is unreachable skips,
// saying why; under CI=true it fails, so a broken CI machine cannot pass by
// skipping.
package testenv

import (
	"context"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Defaults are the services the go-svc machine kind starts before every
// session and CI run.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// PostgresURL returns WARDEN_TEST_POSTGRES_URL (or the default) once the
// server answers on its TCP port.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return reachable(t, "WARDEN_TEST_POSTGRES_URL", DefaultPostgresURL, "5432")
}

// RedisURL returns WARDEN_TEST_REDIS_URL (or the default) once the server
// answers on its TCP port.
func RedisURL(t testing.TB) string {
	t.Helper()
	return reachable(t, "WARDEN_TEST_REDIS_URL", DefaultRedisURL, "6379")
}

// InCI reports whether tests run under CI=true.
func InCI() bool { return os.Getenv("CI") == "true" }

func reachable(t testing.TB, env, def, defPort string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s=%q does not parse: %v", env, raw, err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), defPort)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		if InCI() {
			t.Fatalf("%s: cannot reach %s (%v); CI=true requires it", env, host, err)
		}
		t.Skipf("%s: cannot reach %s (%v); set %s or start the server to run this test", env, host, err, env)
	}
	conn.Close()
	return raw
}
