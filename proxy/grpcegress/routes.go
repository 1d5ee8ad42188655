package grpcegress

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/internal/hostport"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/proxy/admit"
)

const unlistedName = "_unlisted"

// table is the routing of one policy.
type table struct {
	byService     map[string]*route // grpc_service targets
	byHost        map[string]*route // hosts of HTTP targets, for :authority
	unlisted      *route            // nil: refuse
	caps          *tenant.Caps
	tenantHeader  string
	transportKeys map[string]bool
	self          string        // the listener's own address, to refuse loops
	bodyIdle      time.Duration // egress.timeouts.body_idle: a request stream's longest wait for the client
}

// route is one target as the gRPC egress uses it.
type route struct {
	admit.Target
	transport *http.Transport
	scheme    string // "http" (h2c) or "https"
	host      string // upstream host:port; "" forwards to :authority
}

func (tb *table) lookup(service string, authority string) *route {
	if r := tb.byService[service]; r != nil {
		return r
	}
	var b [300]byte
	if hp, n, ok := hostport.Append(b[:0], []byte(authority), "80"); ok {
		if r := tb.byHost[string(hp)]; r != nil {
			return r
		}
		if r := tb.byHost[string(hp[:n])]; r != nil {
			return r
		}
	}
	return tb.unlisted
}

// loops reports whether a call forwarded to authority would come back to
// this listener.
func (tb *table) loops(authority string) bool {
	var b [300]byte
	hp, n, ok := hostport.Append(b[:0], []byte(authority), "80")
	return ok && hostport.SelfAddressed(tb.self, hp, n)
}

func (g *Grpc) build(c *governor.Controls) (*table, error) {
	eg := c.Policy.Egress
	tb := &table{byService: map[string]*route{}, byHost: map[string]*route{}, caps: c.EgressCaps, transportKeys: map[string]bool{},
		bodyIdle: eg.Timeouts.BodyIdle}
	if tb.caps != nil {
		tb.tenantHeader = tb.caps.Header()
	}
	for _, pt := range c.Policy.Targets {
		r, err := g.route(pt, c.Targets[pt.Name], tb)
		if err != nil {
			return nil, err
		}
		if pt.GRPCService != "" {
			tb.byService[pt.GRPCService] = r
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
		r := &route{
			Target: admit.Target{Name: unlistedName, Timeout: eg.Defaults.Timeout, Stats: g.stats.Target(unlistedName)},
			scheme: "http",
		}
		key := transportKey("u:", "http", eg.Defaults.MaxConnections, eg.Defaults.IdleTimeout)
		r.transport = g.transport(key, nil, eg.Defaults.MaxConnections, eg.Defaults.IdleTimeout)
		tb.transportKeys[key] = true
		tb.unlisted = r
	}
	return tb, nil
}

func (g *Grpc) route(pt policy.Target, gt *governor.Target, tb *table) (*route, error) {
	r := &route{
		Target: admit.Target{Name: pt.Name, Breaker: gt.Breaker, Retry: gt.Retry, Pools: gt.Pools, Timeout: pt.Timeout, Stats: g.stats.Target(pt.Name)},
		scheme: "http",
	}
	var tlsConf *tls.Config
	serverName := ""
	if pt.Upstream != "" {
		u, err := url.Parse(pt.Upstream)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("target %s: upstream %q is not an origin", pt.Name, pt.Upstream)
		}
		switch u.Scheme {
		case "h2c", "http":
		case "https":
			r.scheme = "https"
			serverName = u.Hostname()
		default:
			return nil, fmt.Errorf("target %s: upstream scheme %q (want h2c, http or https)", pt.Name, u.Scheme)
		}
		r.host = u.Host
		if u.Port() == "" {
			r.host = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[r.scheme == "https"])
		}
	}
	if r.scheme == "https" {
		tlsConf = &tls.Config{}
		if g.opts.TLS != nil {
			tlsConf = g.opts.TLS.Clone()
		}
		tlsConf.ServerName = serverName
	}
	key := transportKey("t:"+pt.Name+":", r.scheme+"://"+r.host, pt.MaxConnections, pt.IdleTimeout)
	r.transport = g.transport(key, tlsConf, pt.MaxConnections, pt.IdleTimeout)
	tb.transportKeys[key] = true
	return r, nil
}

// transportKey identifies a transport by what shapes it, so an unchanged
// route keeps its connections across reloads.
func transportKey(prefix, upstream string, maxConns int, idle time.Duration) string {
	return fmt.Sprintf("%s%s|%d|%s", prefix, upstream, maxConns, idle)
}

// transport returns the HTTP/2 transport under key, creating it.
func (g *Grpc) transport(key string, tlsConf *tls.Config, maxConns int, idle time.Duration) *http.Transport {
	if t := g.transports[key]; t != nil {
		return t
	}
	var protos http.Protocols
	if tlsConf != nil {
		protos.SetHTTP2(true)
	} else {
		protos.SetUnencryptedHTTP2(true)
	}
	t := &http.Transport{
		Protocols:       &protos,
		TLSClientConfig: tlsConf,
		MaxConnsPerHost: maxConns,
		IdleConnTimeout: idle,
		// The caller's own Accept-Encoding goes through as sent; the
		// transport must not add gzip and then decode the answer.
		DisableCompression: true,
		DialContext:        (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	g.transports[key] = t
	return t
}

// serviceOf returns the service of a gRPC :path ("/pkg.Svc/Method" →
// "pkg.Svc"), or "" when the path is not of that form.
func serviceOf(path string) string {
	if len(path) < 4 || path[0] != '/' {
		return ""
	}
	rest := path[1:]
	i := strings.IndexByte(rest, '/')
	if i <= 0 || i == len(rest)-1 || strings.IndexByte(rest[i+1:], '/') >= 0 {
		return ""
	}
	return rest[:i]
}
