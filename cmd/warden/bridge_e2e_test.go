package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/internal/testkit/testenv"
)

// The built binary with a postgres bridge: psql (and pgx) get through it,
// /v1/bridges and /metrics show it, SIGTERM stops it with status 0.
func TestBridgeEndToEnd(t *testing.T) {
	pgURL := testenv.PostgresURL(t)
	cfg, err := pgx.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	bin := buildWarden(t)
	bridgeAddr, adminAddr := loopback.FreeAddr(t), loopback.FreeAddr(t)
	policy := fmt.Sprintf(`version: 1
shutdown_grace: 5s
admin: { listen: %s }
bridges:
  - name: orders-db
    listen: %s
    upstream: %s
    protocol: postgres
    max_connections: 2
    wait_timeout: 10s
    idle_timeout: 5m
`, adminAddr, bridgeAddr, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	dir := t.TempDir()
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, bin, nil, "run", "--policy", polFile, "--data-dir", filepath.Join(dir, "data"))
	p.waitLog(t, "warden running")

	host, port, _ := net.SplitHostPort(bridgeAddr)
	if psql, err := exec.LookPath("psql"); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, psql, "-h", host, "-p", port, "-U", cfg.User, cfg.Database,
			"-Atc", "select 1").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "1" {
			t.Fatalf("psql through the bridge: %v\n%s", err, out)
		}
	} else {
		t.Log("psql not installed; checking with pgx only")
	}
	conn, err := pgx.Connect(context.Background(), fmt.Sprintf("postgres://%s@%s/%s?sslmode=prefer", cfg.User, bridgeAddr, cfg.Database))
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := conn.QueryRow(context.Background(), "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("pgx through the bridge: %v", err)
	}

	var bridges []map[string]any
	if code, body := get(t, "http://"+adminAddr+"/v1/bridges"); code != 200 || json.Unmarshal([]byte(body), &bridges) != nil {
		t.Fatalf("/v1/bridges: %d %s", code, body)
	}
	if len(bridges) != 1 || bridges[0]["name"] != "orders-db" || bridges[0]["max"] != float64(2) || bridges[0]["live"].(float64) < 1 {
		t.Fatalf("/v1/bridges = %v", bridges)
	}
	if _, ok := bridges[0]["reaped"].(map[string]any)["client_gone"]; !ok {
		t.Fatalf("/v1/bridges reaped = %v", bridges[0]["reaped"])
	}
	_, metrics := get(t, "http://"+adminAddr+"/metrics")
	for _, want := range []string{`warden_bridge_connections{bridge="orders-db",state="in_use"}`,
		`warden_bridge_waiting{bridge="orders-db"} 0`, `warden_bridge_wait_seconds_count{bridge="orders-db"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	conn.Close(context.Background())

	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.exitsZero(t, 15*time.Second)
}
