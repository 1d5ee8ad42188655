// Package loopback runs TCP servers on 127.0.0.1 for tests: the accept
// loop, one goroutine per connection, and a cleanup that closes the
// listener and every connection and waits for all of it, so that goleak
// finds nothing left behind.
package loopback

import (
	"net"
	"sync"
	"testing"
)

// Serve calls handle, in a goroutine of its own, for every connection to a
// new loopback listener until the test ends, and closes the connection
// when handle returns. When the test ends the listener and every
// connection still open are closed, and Serve's goroutines are waited for:
// a handle blocked reading or writing its connection returns then. It
// returns the listener's address.
func Serve(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// FreeAddr returns a loopback address nothing listens on: one the kernel
// just handed out and that was closed again, for tests that need a
// listener's address before it exists or a port that refuses.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
