package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/warden-dev/warden/bench/loadgen"
)

const slowPolicy = `ingress:
  listen: %s
  worker: "http://%s"
  timeouts: { header: 1s, body_idle: 1s, idle: 2s }
egress:
  http_listen: %s
  timeouts: { header: 1s, body_idle: 1s, idle: 2s }
targets:
  - name: up
    hosts: [up.chaos]
    upstream: "http://%s"
`

// slowSlack is what a loaded machine may add to a timeout before warden's
// close reaches the client.
const slowSlack = 9 * time.Second

// slowKind is one way to hold a connection: what is sent, and which
// timeout should end it.
type slowKind struct {
	name    string
	timeout time.Duration
}

var slowKinds = []slowKind{
	{"slow-head", time.Second},          // a header line every 300 ms, never the blank line
	{"slow-body", time.Second},          // Content-Length: 4096, 10 bytes, then nothing
	{"idle-keepalive", 2 * time.Second}, // one request answered, then silence
}

// slowResult is how one held connection ended.
type slowResult struct {
	kind   string
	closed bool          // warden closed it
	after  time.Duration // from the moment the timeout started counting
	got408 bool
}

// holdSlow holds one connection of kind k to addr (Host host) until warden
// closes it or give-up passes.
func holdSlow(ctx context.Context, k slowKind, addr, host string, giveUp time.Duration) slowResult {
	r := slowResult{kind: k.name}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return r
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	start := time.Now()
	_ = c.SetDeadline(start.Add(giveUp))
	var mu sync.Mutex
	from := start // when the timeout starts counting
	switch k.name {
	case "slow-head":
		if _, err := fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: %s\r\n", host); err != nil {
			return r
		}
		stopped := make(chan struct{})
		trickled := make(chan struct{})
		go func() {
			defer close(trickled)
			t := time.NewTicker(300 * time.Millisecond)
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-stopped:
					return
				case <-t.C:
				}
				if _, err := fmt.Fprintf(c, "X-Slow-%d: %d\r\n", i, i); err != nil {
					return
				}
			}
		}()
		defer func() { close(stopped); <-trickled }()
	case "slow-body":
		if _, err := fmt.Fprintf(c, "POST /slow HTTP/1.1\r\nHost: %s\r\nContent-Type: text/plain\r\nContent-Length: 4096\r\n\r\n0123456789", host); err != nil {
			return r
		}
		mu.Lock()
		from = time.Now()
		mu.Unlock()
	case "idle-keepalive":
		if _, err := fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
			return r
		}
	}
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if k.name == "idle-keepalive" && n > 0 && bytes.Contains(got, []byte("\r\n\r\nok")) {
			mu.Lock()
			from = time.Now() // answered: the idle time starts
			mu.Unlock()
			got = got[:0]
		}
		if err != nil {
			if !isTimeoutErr(err) && ctx.Err() == nil {
				r.closed = true
				mu.Lock()
				r.after = time.Since(from)
				mu.Unlock()
			}
			break
		}
	}
	r.got408 = bytes.Contains(got, []byte(" 408 "))
	return r
}

// slowClients: hundreds of connections per listener that send their head
// slowly, stall their body, or idle after a request, against ingress and
// egress with small timeouts, while a well-behaved client keeps sending.
// Warden closes each within its timeout (plus slack for a loaded
// machine), and the well-behaved client is served throughout.
func slowClients(ctx context.Context, s *scenario) error {
	n := s.pick(100, 500)
	wk, a, err := s.prepare(0)
	if err != nil {
		return err
	}
	admin, ingress, egress := a.admin, a.ingress, a.egress
	if _, err := s.launch(ctx, policyFor(admin, fmt.Sprintf(slowPolicy, ingress, wk.addr, egress, wk.addr)), admin, 0); err != nil {
		return err
	}
	giveUp := 15 * time.Second
	s.row.load = fmt.Sprintf("good client 50 req/s on each of ingress and egress (loadgen), for %v", giveUp)
	s.row.fault = fmt.Sprintf("per listener %d slow heads, %d slow bodies, %d idle keep-alives; timeouts header 1s body_idle 1s idle 2s", n, n, n/2)

	listeners := []endpoint{{"ingress", ingress, ingress}, {"egress", egress, "up.chaos"}}
	var goods []*loadgen.Result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		goods = goodClients(ctx, listeners, 50, 4, giveUp)
	}()
	var mu sync.Mutex
	results := map[string][]slowResult{}
	for _, l := range listeners {
		for _, k := range slowKinds {
			count := n
			if k.name == "idle-keepalive" {
				count = n / 2
			}
			for range count {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := holdSlow(ctx, k, l.addr, l.host, giveUp)
					mu.Lock()
					results[l.name+" "+k.name] = append(results[l.name+" "+k.name], r)
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	sleep(ctx, time.Second)

	errs := s.row.checkServed("good-client-served", listeners, goods)
	for _, k := range slowKinds {
		var lines []string
		ok := true
		for _, l := range listeners {
			rs := results[l.name+" "+k.name]
			closed, in, g408 := 0, 0, 0
			var worst time.Duration
			for _, r := range rs {
				if r.closed {
					closed++
					worst = max(worst, r.after)
					if r.after <= k.timeout+slowSlack {
						in++
					}
				}
				if r.got408 {
					g408++
				}
			}
			if in != len(rs) || len(rs) == 0 {
				ok = false
			}
			lines = append(lines, fmt.Sprintf("%s: %d of %d closed by warden (%d within %v + %v slack, slowest %v, %d with a 408)",
				l.name, closed, len(rs), in, k.timeout, slowSlack, worst.Round(10*time.Millisecond), g408))
		}
		s.row.check(k.name+"-closed", ok, "%s; %s", lines[0], lines[1])
	}
	s.row.clientErrors = errs
	s.settle()
	return nil
}
