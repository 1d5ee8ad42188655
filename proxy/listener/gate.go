package listener

import (
	"log/slog"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/accept"
	"github.com/warden-dev/warden/internal/rawio"
)

// gate is the listening socket as a server sees it: temporary accept
// errors retried (accept.Listener), connections over the cap closed as
// they come, and every connection let through counted until it is closed.
type gate struct {
	*accept.Listener
	name string
	raw  bool // fasthttp's: raw socket I/O, and the connection keeps the timeouts (conn)
	log  *slog.Logger
	lim  atomic.Pointer[Limits]

	live    atomic.Int64 // connections let through and not closed yet
	refused atomic.Int64 // of the burst of refusals in progress

	m gateMetrics
}

type gateMetrics struct {
	conns                  prometheus.Gauge
	refused                prometheus.Counter
	header, bodyIdle, idle prometheus.Counter // timeouts by reason
}

func newGateMetrics(m *metrics.Metrics, name string) gateMetrics {
	to := func(reason string) prometheus.Counter { return m.ListenerTimeouts.WithLabelValues(name, reason) }
	return gateMetrics{
		conns:    m.ListenerConnections.WithLabelValues(name),
		refused:  m.ListenerRefused.WithLabelValues(name),
		header:   to("header"),
		bodyIdle: to("body_idle"),
		idle:     to("idle"),
	}
}

// Accept returns the next connection the cap lets through. One over the
// cap is closed before anything is read from it, and counted.
func (g *gate) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lim := g.lim.Load()
		if n := g.live.Add(1); lim.MaxConns > 0 && n > int64(lim.MaxConns) {
			g.live.Add(-1)
			_ = c.Close()
			g.refuse(lim.MaxConns)
			continue
		}
		if g.refused.Load() != 0 {
			g.admitting()
		}
		g.m.conns.Inc()
		if g.raw {
			// The data plane's hot connections read and write with raw
			// calls (internal/rawio); the counting and the timeouts sit
			// on top, per connection.
			return newConn(rawio.WrapLazy(c), g, lim.Timeouts), nil
		}
		return newHTTPConn(c, g, lim.Timeouts), nil
	}
}

// refuse counts a connection closed over the cap; the first of a burst is
// logged.
func (g *gate) refuse(max int) {
	g.m.refused.Inc()
	if g.refused.Add(1) == 1 {
		g.log.Warn("listener full: closing new connections as they come", "listener", g.name,
			"addr", g.Addr().String(), "max_connections", max)
	}
}

// admitting ends a burst of refusals with one log line.
func (g *gate) admitting() {
	if n := g.refused.Swap(0); n > 0 {
		g.log.Info("listener admitting connections again", "listener", g.name, "addr", g.Addr().String(), "refused", n)
	}
}

// release uncounts a connection that has closed.
func (g *gate) release() {
	g.live.Add(-1)
	g.m.conns.Dec()
}

// setLimits applies lim: its cap to the next connection, its timeouts to
// the connections accepted from now on.
func (g *gate) setLimits(lim Limits) { g.lim.Store(&lim) }
