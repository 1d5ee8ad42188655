package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// h2client is a lean gRPC client for load generation: unary calls written
// as raw HTTP/2 frames on a shared connection, the way Envoy (C++) calls
// an RLS, so that the generator does not take as much CPU as the server it
// measures. It checks grpc-status and that the response's overall_code is
// OK; it does not decode the rest of the response.
type h2client struct {
	conn net.Conn

	wmu     sync.Mutex // the write side: framer, encoder, stream ids
	bw      *bufio.Writer
	fr      *http2.Framer
	hbuf    bytes.Buffer
	henc    *hpack.Encoder
	nextID  uint32
	writers atomic.Int32 // callers writing or waiting to: the last one flushes

	window     int64 // connection send window, under wmu
	windowCond *sync.Cond

	pmu     sync.Mutex
	pending map[uint32]chan error
	failed  error
	path    string
	host    string
}

const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func dialH2(addr string) (*h2client, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &h2client{conn: conn, bw: bufio.NewWriterSize(conn, 64<<10), nextID: 1, window: 65535,
		pending: map[uint32]chan error{}, path: rlsMethod, host: addr}
	c.windowCond = sync.NewCond(&c.wmu)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(conn, 64<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
		return nil, err
	}
	// A large receive window so the server never waits for our updates.
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		return nil, err
	}
	if err := c.fr.WriteWindowUpdate(0, 1<<30); err != nil {
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

func (c *h2client) close() { c.conn.Close() }

// call sends one request (a marshalled RateLimitRequest) and waits for
// its answer.
func (c *h2client) call(msg []byte) error {
	done := make(chan error, 1)
	body := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	copy(body[5:], msg)

	c.writers.Add(1)
	c.wmu.Lock()
	for c.window < int64(len(body)) && c.failed == nil {
		c.windowCond.Wait()
	}
	id := c.nextID
	c.nextID += 2
	c.pmu.Lock()
	if c.failed != nil {
		err := c.failed
		c.pmu.Unlock()
		c.wmu.Unlock()
		c.writers.Add(-1)
		return err
	}
	c.pending[id] = done
	c.pmu.Unlock()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", c.path}, {":authority", c.host},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	if err == nil {
		err = c.fr.WriteData(id, true, body)
		c.window -= int64(len(body))
	}
	// The last writer in line flushes for everyone queued behind the lock.
	if c.writers.Add(-1) == 0 && err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		return err
	}
	return <-done
}

func (c *h2client) fail(err error) {
	c.pmu.Lock()
	c.failed = err
	for id, ch := range c.pending {
		ch <- err
		delete(c.pending, id)
	}
	c.pmu.Unlock()
	c.wmu.Lock()
	c.windowCond.Broadcast()
	c.wmu.Unlock()
}

func (c *h2client) finish(id uint32, err error) {
	c.pmu.Lock()
	ch := c.pending[id]
	delete(c.pending, id)
	c.pmu.Unlock()
	if ch != nil {
		ch <- err
	}
}

var okPrefix = func() []byte {
	b, _ := proto.Marshal(&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK})
	return b
}()

func (c *h2client) readLoop() {
	bodies := map[uint32]error{} // per stream: nil once an OK response message was seen
	unread := uint32(0)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(fmt.Errorf("h2 read: %w", err))
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.control(func() error { return c.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.control(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.wmu.Lock()
				c.window += int64(f.Increment)
				c.windowCond.Broadcast()
				c.wmu.Unlock()
			}
		case *http2.DataFrame:
			d := f.Data()
			if len(d) >= 5+len(okPrefix) && bytes.Equal(d[5:5+len(okPrefix)], okPrefix) {
				bodies[f.StreamID] = nil
			} else {
				bodies[f.StreamID] = fmt.Errorf("response is not OK: % x", d)
			}
			if unread += uint32(len(d)); unread > 1<<20 {
				n := unread
				unread = 0
				c.control(func() error { return c.fr.WriteWindowUpdate(0, n) })
			}
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				continue // response headers; the trailers end the stream
			}
			err, seen := bodies[f.StreamID]
			delete(bodies, f.StreamID)
			if st := f.PseudoValue("status"); st != "" && st != "200" {
				err = fmt.Errorf("http status %s", st)
			} else if gs := headerValue(f, "grpc-status"); gs != "0" {
				err = fmt.Errorf("grpc-status %s: %s", gs, headerValue(f, "grpc-message"))
			} else if !seen {
				err = errors.New("no response message")
			}
			c.finish(f.StreamID, err)
		case *http2.RSTStreamFrame:
			delete(bodies, f.StreamID)
			c.finish(f.StreamID, fmt.Errorf("stream reset: %v", f.ErrCode))
		case *http2.GoAwayFrame:
			c.fail(fmt.Errorf("goaway: %v", f.ErrCode))
			return
		}
	}
}

// control writes a connection-level frame and flushes it.
func (c *h2client) control(write func() error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := write(); err == nil {
		_ = c.bw.Flush()
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}
