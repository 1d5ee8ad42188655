package redistest

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/internal/testkit/loopback"
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
	p := &StallProxy{resume: make(chan struct{}), held: make(chan struct{}, 1)}
	addr := loopback.Serve(t, func(c net.Conn) {
		u, err := net.Dial("tcp", opt.Addr)
		if err != nil {
			return
		}
		done := make(chan struct{})
		go func() { p.fromClient(u, c); u.Close(); close(done) }()
		io.Copy(c, u)
		c.Close()
		<-done
	})
	// Registered after Serve's cleanup, so it runs first: held traffic
	// goes through, and the connections can end.
	t.Cleanup(p.Resume)
	p.URL = fmt.Sprintf("redis://%s/%d", addr, opt.DB)
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
