package connpool

import (
	"bufio"
	"crypto/tls"
	"net"
	"time"

	"github.com/warden-dev/warden/internal/rawio"
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
	out *sender // what bw flushes into

	born     int64     // janitor tick the connection was dialled at
	idleFrom int64     // janitor tick it last went idle
	idleAt   time.Time // when it last went idle, to the clock
	reused   bool      // taken from the idle list rather than dialled for this exchange
	deadline time.Time // the deadline last set on nc
}

func (p *Pool) dial(deadline time.Time) (*Conn, error) {
	if deadline.IsZero() {
		timeout := p.cfg.DialTimeout
		if timeout <= 0 {
			timeout = defaultDialTimeout
		}
		deadline = time.Now().Add(timeout)
	}
	d := net.Dialer{Deadline: deadline, KeepAlive: 30 * time.Second}
	raw, err := d.Dial("tcp", p.cfg.Addr)
	if err != nil {
		return nil, wrap(KindDial, "dial", p.cfg.Addr, err)
	}
	raw = rawio.WrapLazy(raw)
	nc := raw
	var set time.Time // the deadline left on the connection
	if p.tls != nil {
		tc := tls.Client(raw, p.tls)
		_ = tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			raw.Close()
			return nil, wrap(KindDial, "TLS handshake with", p.cfg.Addr, err)
		}
		nc = tc
		set = deadline
	}
	out := &sender{nc: nc}
	return &Conn{
		nc: nc, raw: raw, deadline: set, out: out,
		br:   bufio.NewReaderSize(nc, readBufferSize),
		bw:   bufio.NewWriterSize(out, writeBufferSize),
		born: p.set.ticks(),
	}, nil
}

// sender is what a connection's bufio.Writer flushes into. When a request
// goes out in one write (await), that write also waits for the reply to
// begin (rawio.WriteAwaitingReply), which spares the response read a first
// attempt that would find nothing. Over TLS nc is not a raw connection, and
// WriteAwaitingReply is a plain write.
type sender struct {
	nc     net.Conn
	await  bool
	writes int // writes made, so that a request can tell it took only one
}

func (s *sender) Write(p []byte) (int, error) {
	s.writes++
	if s.await {
		return rawio.WriteAwaitingReply(s.nc, p)
	}
	return s.nc.Write(p)
}

// idleState is what an idle connection holds on its way out of the pool:
// PeekNothing (or PeekUnknown, where the socket cannot be asked) means it
// can carry a request; PeekData means the upstream sent bytes nobody asked
// for (a second response, a 408, a TLS close_notify); PeekClosed means it
// closed. It peeks at the socket without blocking.
func (c *Conn) idleState() rawio.Peeked {
	if c.br.Buffered() > 0 {
		return rawio.PeekData
	}
	return rawio.Peek(c.raw)
}

func (c *Conn) close() { _ = c.nc.Close() }

// setDeadline bounds the next exchange. Most exchanges on a connection
// have no deadline (the ingress) or a new one (a target's timeout); the
// system call is skipped when nothing changes.
func (c *Conn) setDeadline(t time.Time) error {
	if t.Equal(c.deadline) {
		return nil
	}
	c.deadline = t
	return c.nc.SetDeadline(t)
}
