package redistest

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// StallProxy forwards TCP to a Redis and can hold back what its clients
// send, to keep a call on the wire for as long as a test needs (to show
// that nothing waits for it under a lock, say). It reports when held
// bytes arrive.
type StallProxy struct {
	// URL is the Redis URL through the proxy (the same database).
	URL string

	mu      sync.Mutex
	stalled bool
	resume  chan struct{}
	held    chan struct{}
}

// NewStallProxy starts a proxy to the Redis at url; it stops when the test
// ends.
func NewStallProxy(t testing.TB, url string) *StallProxy {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &StallProxy{URL: fmt.Sprintf("redis://%s/%d", ln.Addr(), opt.DB), resume: make(chan struct{}), held: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); p.Resume(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", opt.Addr)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); p.fromClient(u, c); u.Close() }()
			go func() { defer wg.Done(); io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

// fromClient copies the client's bytes to Redis, waiting while stalled.
func (p *StallProxy) fromClient(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled, resume := p.stalled, p.resume
			p.mu.Unlock()
			if stalled {
				select {
				case p.held <- struct{}{}:
				default:
				}
				<-resume
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Stall holds back what clients send from now on.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	p.stalled, p.resume = true, make(chan struct{})
	p.mu.Unlock()
}

// Resume lets held and further traffic through.
func (p *StallProxy) Resume() {
	p.mu.Lock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
	p.mu.Unlock()
}

// Held gets a value when bytes arrive while stalled: a call is on the wire.
func (p *StallProxy) Held() <-chan struct{} { return p.held }
