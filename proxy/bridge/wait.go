package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/proxy/bridge/dbpool"
)

// maxEarly bounds what a waiting client may send before it has a
// connection (tcp protocols where the client speaks first); beyond it the
// bridge stops reading until the client is served.
const maxEarly = 64 << 10

var errClientGone = errors.New("client went away while waiting")

// acquire gets client c an upstream connection from g's pool. While it
// waits, it watches the client: one that goes away leaves the queue (its
// turn is not wasted), bytes it sends are kept for the upstream, and a run
// that ends takes its client out of the queue too.
func (b *bridge) acquire(c *net.TCPConn, g *generation, key string, runEnded <-chan struct{}) (*dbpool.Conn, []byte, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var w *watch
	conn, waited, err := g.pool.Acquire(ctx, key, g.cfg.WaitTimeout, func() {
		b.notify()
		w = watchClient(c, cancel, g.cfg.Protocol != protocolPostgres, b.set.keptAtEOF)
		if runEnded != nil {
			go func() {
				select {
				case <-runEnded:
					cancel(errRunEnded)
				case <-ctx.Done():
				}
			}()
		}
	})
	b.waitHist.Observe(waited.Seconds())
	var early []byte
	if w != nil {
		early = w.stop()
	}
	if err != nil {
		return nil, nil, err
	}
	return conn, early, nil
}

// watch reads a waiting client.
type watch struct {
	c    *net.TCPConn
	buf  []byte
	done chan struct{}
}

// watchClient reads waiting client c until stopped. A client whose stream
// ends is gone and leaves the queue, unless tcp is set and it sent bytes
// first: it half-closed after its request and awaits the reply, so it keeps
// its turn, and once it has a connection its bytes are delivered followed
// by the half-close (the session reads its EOF again), as a direct
// connection would have delivered them. kept, if set, runs then.
func watchClient(c *net.TCPConn, gone context.CancelCauseFunc, tcp bool, kept func()) *watch {
	w := &watch{c: c, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var tmp [4096]byte
		for len(w.buf) < maxEarly {
			n, err := c.Read(tmp[:])
			w.buf = append(w.buf, tmp[:n]...)
			switch {
			case err == nil:
				continue
			case errors.Is(err, errDeadline):
			case tcp && errors.Is(err, io.EOF) && len(w.buf) > 0:
				if kept != nil {
					kept()
				}
			default:
				gone(errClientGone)
			}
			return
		}
	}()
	return w
}

// stop ends the watch and returns what the client sent meanwhile.
func (w *watch) stop() []byte {
	_ = w.c.SetReadDeadline(aLongTimeAgo)
	<-w.done
	_ = w.c.SetReadDeadline(time.Time{})
	return w.buf
}

// refuseAcquire tells a client why it got no connection; runID is the run
// it is bound to, if any.
func (b *bridge) refuseAcquire(c *net.TCPConn, g *generation, runID string, err error) {
	pg := g.cfg.Protocol == protocolPostgres
	var wt *dbpool.WaitTimeout
	var de *dbpool.DialError
	switch {
	case errors.As(err, &wt):
		b.set.opts.Metrics.Rejections.WithLabelValues(string(control.BridgeConnections), b.name).Inc()
		b.log.Info("client refused: no connection free", "waited", wt.Waited, "max_connections", wt.Max)
		if pg {
			b.refuse(c, waitRefusal(b.name, wt.Max, wt.Waited))
			return
		}
	case errors.Is(err, dbpool.ErrClosed):
		if pg {
			b.refuse(c, fatal("57P01", fmt.Sprintf("bridge %s is closing: %s", b.name, b.closingWhy()), ""))
			return
		}
	case errors.As(err, &de):
		b.log.Warn("upstream unreachable", "upstream", de.Addr, "err", de.Err)
		if pg {
			b.refuse(c, fatal("08001", fmt.Sprintf("bridge %s: cannot connect to upstream %s: %v", b.name, de.Addr, de.Err), ""))
			return
		}
	case errors.Is(err, errRunEnded):
		// A reap like any other of its run's connections (README), though
		// it held no slot yet: counted, logged and named the same way.
		b.countReap(ReasonRunEnded, "run", runID, "connection", "client waiting for a slot")
		if pg {
			b.refuse(c, fatal("57P01", fmt.Sprintf("bridge %s: run %s has ended while its client waited", b.name, runID), ""))
			return
		}
	}
	_ = c.Close()
}

// refuse sends a client its last message and closes the connection,
// draining briefly what it still sends so the message is not lost to a
// reset.
func (b *bridge) refuse(c *net.TCPConn, msg []byte) {
	_ = c.SetWriteDeadline(time.Now().Add(farewellTimeout))
	if _, err := c.Write(msg); err == nil {
		_ = c.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(farewellTimeout))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, maxEarly))
	}
	_ = c.Close()
}

// isDisconnect reports an error that only means the client left.
func isDisconnect(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, errDeadline)
}
