package grpcegress

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// stallWatch bounds the waits of a call's request stream, as the fasthttp
// listeners bound a body's reads (egress.timeouts.body_idle): a read that
// waits longer than idle for the client ends the stream. HTTP/2 has a
// per-stream read deadline (http.ResponseController), but moving it is a
// message to the connection's serving goroutine; one timer per call,
// looking at when the read in progress began, costs a read two atomic
// stores instead. Time spent not reading (the upstream slow to take what
// was sent) does not count.
type stallWatch struct {
	io.ReadCloser
	rc    *http.ResponseController
	idle  time.Duration
	count func()

	began atomic.Int64 // when the read in progress began (Unix ns); 0: none
	fired atomic.Bool

	mu    sync.Mutex
	timer *time.Timer
	done  bool // the handler returned: rc is no longer to be used
}

func newStallWatch(w http.ResponseWriter, body io.ReadCloser, idle time.Duration, count func()) *stallWatch {
	s := &stallWatch{ReadCloser: body, rc: http.NewResponseController(w), idle: idle, count: count}
	s.timer = time.AfterFunc(idle, s.check)
	return s
}

func (s *stallWatch) Read(p []byte) (int, error) {
	s.began.Store(time.Now().UnixNano())
	n, err := s.ReadCloser.Read(p)
	s.began.Store(0)
	return n, err
}

// check ends the stream when the read in progress has waited idle, and
// otherwise looks again when the read in progress, or the next one, could
// have.
func (s *stallWatch) check() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	next := s.idle
	if began := s.began.Load(); began != 0 {
		waited := time.Since(time.Unix(0, began))
		if waited >= s.idle {
			s.fired.Store(true)
			s.count()
			// A deadline passed ends the stream's body at once: the
			// read in progress fails, and the exchange with it.
			_ = s.rc.SetReadDeadline(time.Unix(1, 0))
			return
		}
		next = s.idle - waited
	}
	s.timer.Reset(next)
}

// stop ends the watch; the handler returns after it.
func (s *stallWatch) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	s.timer.Stop()
}

// stalled reports whether r's stream was ended by a stallWatch.
func stalled(r *http.Request) bool {
	s, ok := r.Body.(*stallWatch)
	return ok && s.fired.Load()
}
