package bridge

import "sync"

// loginCache remembers, per login (the startup parameters), what the
// server said when it admitted that login without asking for a password.
// A client presenting the same login again is answered from here at once
// and given a server connection only when it first sends something (the
// bridge is the server's peer either way; a login the server has since
// stopped admitting gets the server's error at that first query when a
// new connection is made, or is served by a kept one, as PgBouncer does),
// and a client that waits for a connection is then waiting in a query, not
// in a login — clients that open connections synchronously
// (pgbench -C, pools filling up) would otherwise block behind sessions they
// themselves hold. Logins that needed a password are never cached.
type loginCache struct {
	mu sync.Mutex
	m  map[string]*welcome
}

// maxCachedLogins bounds the cache; when full it starts over.
const maxCachedLogins = 1024

func newLoginCache() *loginCache { return &loginCache{m: map[string]*welcome{}} }

func (c *loginCache) get(key string) *welcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key]
}

func (c *loginCache) put(key string, w *welcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedLogins {
		clear(c.m)
	}
	c.m[key] = w
}

func (c *loginCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}
