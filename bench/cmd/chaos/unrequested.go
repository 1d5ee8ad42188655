package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

const unrequestedPolicy = `ingress: { listen: %s, worker: "http://%s" }
egress: { http_listen: %s }
targets:
  - name: liar
    hosts: [liar.chaos]
    upstream: "http://%s"
`

// liar is an upstream (or worker) that answers each request correctly,
// its body the request's x-tag, and 2 ms later writes a second response
// nobody asked for on the same keep-alive connection. It says on written
// when that second response is out.
type liar struct {
	ln      net.Listener
	written chan string // the tag whose unrequested response was written
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
}

func startLiar() (*liar, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &liar{ln: ln, written: make(chan string, 16), conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.conns[c] = struct{}{}
			l.mu.Unlock()
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.serve(c)
				c.Close()
				l.mu.Lock()
				delete(l.conns, c)
				l.mu.Unlock()
			}()
		}
	}()
	return l, nil
}

func (l *liar) addr() string { return l.ln.Addr().String() }

func (l *liar) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		tag := req.Header.Get("x-tag")
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(tag), tag); err != nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
		extra := "UNREQUESTED after " + tag
		_, err = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(extra), extra)
		select {
		case l.written <- tag:
		default:
		}
		if err != nil {
			return
		}
	}
}

func (l *liar) close() {
	l.ln.Close()
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// unrequested: a worker behind the ingress and an upstream behind the
// egress that each write an unrequested response 2 ms after every answer,
// while two clients, each on its own connection to warden, alternate
// requests (the next one sent once the unrequested bytes are on the
// pooled connection, before warden's 10 ms idle check would look). Every
// answer must carry its own request's tag: no client ever receives a
// response meant for nobody or for another.
func unrequested(ctx context.Context, s *scenario) error {
	iterations := s.pick(300, 2000)
	worker, err := startLiar()
	if err != nil {
		return err
	}
	s.later(worker.close)
	upstream, err := startLiar()
	if err != nil {
		return err
	}
	s.later(upstream.close)
	a, err := freeAddrs()
	if err != nil {
		return err
	}
	admin, ingress, egress := a.admin, a.ingress, a.egress
	if _, err := s.launch(ctx, policyFor(admin, fmt.Sprintf(unrequestedPolicy, ingress, worker.addr(), egress, upstream.addr())), admin, 0); err != nil {
		return err
	}
	s.row.load = fmt.Sprintf("2 clients alternating, %d requests on each of ingress and egress", iterations)
	s.row.fault = "worker and upstream write a second, unrequested response 2 ms after each answer"

	errs := 0
	for _, l := range []struct {
		name, addr, host string
		liar             *liar
	}{{"ingress", ingress, ingress, worker}, {"egress", egress, "liar.chaos", upstream}} {
		crossed, failed, served, example := alternate(ctx, l.addr, l.host, l.liar, iterations)
		errs += failed
		s.row.check("no-crossed-responses-"+l.name, crossed == 0 && served > 0,
			"%d answered 200, %d of them carrying another request's body or an unrequested one%s; %d errors",
			served, crossed, example, failed)
	}
	s.row.clientErrors = errs
	s.settle()
	return nil
}

// alternate sends n requests through addr, from two clients in turn, and
// counts the answers whose body is not their own request's tag.
func alternate(ctx context.Context, addr, host string, l *liar, n int) (crossed, failed, served int, example string) {
	clients := []*fasthttp.HostClient{
		{Addr: addr, MaxConns: 1, MaxIdemponentCallAttempts: 1, ReadTimeout: 5 * time.Second},
		{Addr: addr, MaxConns: 1, MaxIdemponentCallAttempts: 1, ReadTimeout: 5 * time.Second},
	}
	defer clients[0].CloseIdleConnections()
	defer clients[1].CloseIdleConnections()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		tag := fmt.Sprintf("client-%c-%d", 'A'+i%2, i)
		req.Reset()
		req.SetRequestURI("/u")
		req.Header.SetHost(host)
		req.Header.Set("x-tag", tag)
		err := clients[i%2].DoTimeout(req, resp, 5*time.Second)
		switch {
		case err != nil || resp.StatusCode() != 200:
			failed++
		case string(resp.Body()) != tag:
			served++
			crossed++
			if example == "" {
				example = fmt.Sprintf(" (e.g. %s got %q)", tag, resp.Body())
			}
		default:
			served++
		}
		// The next request goes once the unrequested bytes are on the
		// connection (a millisecond to cross loopback), within warden's
		// 10 ms idle check.
		timeout := time.After(time.Second)
	wait:
		for {
			select {
			case t := <-l.written:
				if t == tag {
					time.Sleep(time.Millisecond)
					break wait
				}
			case <-timeout:
				break wait
			}
		}
	}
	return crossed, failed, served, example
}
