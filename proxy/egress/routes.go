package egress

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/internal/hostport"
	"github.com/warden-dev/warden/proxy/admit"
)

// unlistedName labels requests to hosts no target lists. A target name
// must start with a letter or digit, so it never collides.
const unlistedName = "_unlisted"

// table is the routing of one policy, swapped whole on reload.
type table struct {
	byHost       map[string]*route // "host:port" and "host", lower case
	unlisted     *route            // nil: unlisted hosts get 403
	caps         *tenant.Caps
	tenantHeader string // lower case
	self         string // the listener's own address, to refuse loops
	fixedPools   map[string]bool
}

// route is one target as the HTTP egress uses it.
type route struct {
	admit.Target
	// fixed is the pool of a target with an upstream; nil means the
	// request goes to the host it names, through a dynamic pool.
	fixed        *connpool.Pool
	upstreamAddr string // host:port of the upstream
	hostHeader   []byte // Host sent to the upstream ("" keeps the caller's)
	maxConns     int
	idleTimeout  time.Duration
	poolPrefix   string // dynamic pool keys: prefix + scheme + host:port
}

// lookup finds the route for a normalised authority: the exact host:port
// first, then the host alone (any port), then the unlisted route.
func (tb *table) lookup(hostport []byte, hostLen int) *route {
	if r := tb.byHost[string(hostport)]; r != nil {
		return r
	}
	if r := tb.byHost[string(hostport[:hostLen])]; r != nil {
		return r
	}
	return tb.unlisted
}

// build turns c's policy into a routing table.
func (e *Egress) build(c *governor.Controls) (*table, error) {
	eg := c.Policy.Egress
	tb := &table{byHost: map[string]*route{}, caps: c.EgressCaps, fixedPools: map[string]bool{}}
	if tb.caps != nil {
		tb.tenantHeader = strings.ToLower(tb.caps.Header())
	}
	for _, pt := range c.Policy.Targets {
		if len(pt.Hosts) == 0 {
			continue // a gRPC target
		}
		gt := c.Targets[pt.Name]
		r := &route{
			Target: admit.Target{
				Name: pt.Name, Breaker: gt.Breaker, Retry: gt.Retry, Pools: gt.Pools,
				Timeout: pt.Timeout, Stats: e.stats.Target(pt.Name),
			},
			maxConns: pt.MaxConnections, idleTimeout: pt.IdleTimeout,
			poolPrefix: "d:" + pt.Name + ":",
		}
		if pt.Upstream != "" {
			if err := e.fixUpstream(r, pt.Name, pt.Upstream); err != nil {
				return nil, err
			}
			tb.fixedPools["t:"+pt.Name] = true
		}
		for _, h := range pt.Hosts {
			key, err := hostport.Key(h)
			if err != nil {
				return nil, fmt.Errorf("target %s: %w", pt.Name, err)
			}
			tb.byHost[key] = r
		}
	}
	if eg.AllowUnlisted {
		tb.unlisted = &route{
			Target:   admit.Target{Name: unlistedName, Timeout: eg.Defaults.Timeout, Stats: e.stats.Target(unlistedName)},
			maxConns: eg.Defaults.MaxConnections, idleTimeout: eg.Defaults.IdleTimeout,
			poolPrefix: "u:",
		}
	}
	return tb, nil
}

// fixUpstream points r at its target's upstream origin.
func (e *Egress) fixUpstream(r *route, name, upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("target %s: upstream %q is not an http(s) origin", name, upstream)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
	}
	r.upstreamAddr = addr
	r.hostHeader = []byte(u.Host)
	cfg := connpool.Config{Addr: addr, MaxConns: r.maxConns, IdleTimeout: r.idleTimeout}
	if u.Scheme == "https" {
		cfg.TLS, cfg.ServerName = e.tlsBase, u.Hostname()
	}
	// Unchanged settings get the same pool back, connections and all.
	r.fixed = e.pools.Pool("t:"+name, cfg)
	return nil
}

// pool returns the connection pool for a request to hostport over scheme
// (dynamic routes only dial what the request names).
func (e *Egress) pool(r *route, https bool, hostport []byte) *connpool.Pool {
	if r.fixed != nil {
		return r.fixed
	}
	var kb [300]byte
	key := append(kb[:0], r.poolPrefix...)
	if https {
		key = append(key, "https:"...)
	} else {
		key = append(key, "http:"...)
	}
	key = append(key, hostport...)
	// The key names the address; the route's settings may have changed
	// with a reload since the pool was made, and then Dynamic replaces it.
	if p := e.pools.Lookup(key); p != nil && sameConnSettings(p.Config(), r) {
		return p
	}
	cfg := connpool.Config{Addr: string(hostport), MaxConns: r.maxConns, IdleTimeout: r.idleTimeout}
	if https {
		cfg.TLS = e.tlsBase
		if h, _, err := net.SplitHostPort(cfg.Addr); err == nil {
			cfg.ServerName = strings.Trim(h, "[]")
		}
	}
	return e.pools.Dynamic(key, cfg)
}

// sameConnSettings reports whether a dynamic pool was made with r's
// connection settings.
func sameConnSettings(c connpool.Config, r *route) bool {
	return c.MaxConns == r.maxConns && c.IdleTimeout == r.idleTimeout
}
