package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// redisServer is a private redis-server on a free loopback port, never the
// shared one: the Redis scenarios stop and start it to play an outage.
type redisServer struct {
	s    *scenario
	addr string
	p    *proc
}

func (s *scenario) startRedis(ctx context.Context) (*redisServer, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	r := &redisServer{s: s, addr: ports[0]}
	s.later(r.kill)
	return r, r.start(ctx)
}

func (r *redisServer) url() string { return "redis://" + r.addr + "/0" }

// start runs redis-server (no persistence) on its port and waits until it
// answers PING.
func (r *redisServer) start(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(r.addr)
	p, err := r.s.env.procs.start(spawn{name: "redis-server", logPath: filepath.Join(r.s.env.logDir, r.s.name+"-redis.log"),
		dir: r.s.dir, bin: "redis-server",
		args: []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"}})
	if err != nil {
		return fmt.Errorf("%w (apt-get install redis-server)", err)
	}
	r.p = p
	deadline := time.Now().Add(10 * time.Second)
	for {
		if redisPing(r.addr) == nil {
			return nil
		}
		if p.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis-server on %s did not answer (log %s-redis.log)", r.addr, r.s.name)
		}
		time.Sleep(20 * time.Millisecond) // a server process has no readiness event
	}
}

// kill is kill -9 by PID: the outage.
func (r *redisServer) kill() {
	if r.p != nil {
		r.p.kill()
		r.p = nil
	}
}

// redisPing sends PING in RESP and expects +PONG.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	b := make([]byte, 7)
	n, err := c.Read(b)
	if err != nil {
		return err
	}
	if string(b[:n]) != "+PONG\r\n" {
		return fmt.Errorf("PING: %q", b[:n])
	}
	return nil
}
