package connpool

import (
	"bufio"
	"crypto/tls"
	"net"
	"time"
)

// Buffer sizes per upstream connection. The read buffer bounds the
// response head an upstream may send (16 KiB covers cookie-heavy APIs).
const (
	readBufferSize  = 16 << 10
	writeBufferSize = 8 << 10
)

// defaultDialTimeout bounds a dial made for an exchange without deadline.
const defaultDialTimeout = 10 * time.Second

// Conn is one upstream connection with its buffers.
type Conn struct {
	nc  net.Conn // what is read and written (TLS when the pool originates it)
	raw net.Conn // the TCP connection under nc, probed for liveness
	br  *bufio.Reader
	bw  *bufio.Writer

	born     int64 // janitor tick the connection was dialled at
	idleFrom int64 // janitor tick it last went idle
	reused   bool  // taken from the idle list rather than dialled for this exchange
}

func (p *Pool) dial(deadline time.Time) (*Conn, error) {
	if deadline.IsZero() {
		deadline = time.Now().Add(defaultDialTimeout)
	}
	d := net.Dialer{Deadline: deadline, KeepAlive: 30 * time.Second}
	raw, err := d.Dial("tcp", p.cfg.Addr)
	if err != nil {
		return nil, wrap(KindDial, "dial", p.cfg.Addr, err)
	}
	nc := raw
	if p.tls != nil {
		tc := tls.Client(raw, p.tls)
		_ = tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			raw.Close()
			return nil, wrap(KindDial, "TLS handshake with", p.cfg.Addr, err)
		}
		nc = tc
	}
	return &Conn{
		nc: nc, raw: raw,
		br:   bufio.NewReaderSize(nc, readBufferSize),
		bw:   bufio.NewWriterSize(nc, writeBufferSize),
		born: p.set.ticks(),
	}, nil
}

// alive reports whether an idle connection can still carry a request: the
// upstream has neither closed it nor sent anything unasked (a 408, a TLS
// close_notify). It peeks at the socket without blocking (see peek_*.go).
func (c *Conn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	return peekIdle(c.raw)
}

func (c *Conn) close() { _ = c.nc.Close() }
