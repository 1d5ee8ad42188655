// Package redistest helps tests that need Redis: a unique key prefix per
// test on the machine's Redis (cleaned up afterwards), and a private
// redis-server child process that a test may stop and restart to play an
// outage without touching anyone else's server.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/internal/testkit/testenv"
)

// Prefix returns a key prefix unique to this test run and deletes every key
// under it when the test ends.
func Prefix(t testing.TB, url string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "wardentest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { DeletePrefix(t, url, prefix) })
	return prefix
}

// DeletePrefix deletes every key starting with prefix.
func DeletePrefix(t testing.TB, url, prefix string) {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Errorf("redis url %q: %v", url, err)
		return
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("cleaning up %s*: %v", prefix, err)
		return
	}
	if len(keys) > 0 {
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Logf("cleaning up %s*: %v", prefix, err)
		}
	}
}

// Client returns a plain go-redis client for url, closed with the test.
func Client(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redis url %q: %v", url, err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Server is a redis-server child process on a loopback port of its own.
type Server struct {
	t    testing.TB
	Port int
	URL  string
	cmd  *exec.Cmd
}

// StartServer starts a private redis-server (no persistence) on a free
// port and stops it when the test ends. Without a redis-server binary it
// skips the test, or fails it under CI=true (.ci/run installs one).
func StartServer(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testenv.InCI() {
			t.Fatalf("redis-server not installed (CI=true): %v", err)
		}
		t.Skipf("redis-server not installed: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{t: t, Port: port, URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port)}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the server on its port and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("redistest: server already running")
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	opt, _ := redis.ParseURL(s.URL)
	opt.MaxRetries = -1
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.Stop()
			s.t.Fatalf("redis-server on port %d did not answer within 10s: %v", s.Port, err)
		}
		time.Sleep(10 * time.Millisecond) // the server process has no readiness event to wait on
	}
}

// Stop kills the server (by its PID) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}
