package scheduler

import (
	"context"
	"sync"
	"time"
)

// abort is the context of one delivery: cancelled when the run times out,
// is completed by the worker meanwhile, or is abandoned by a drain. Its done
// channel is made only if the deliverer asks for it, so an in-process
// deliverer that never waits costs no allocation; it lives inside the
// active run.
type abort struct {
	mu      sync.Mutex
	done    chan struct{}
	aborted bool
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *abort) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *abort) Value(any) any               { return nil }

func (c *abort) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.aborted {
			return closedChan
		}
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *abort) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		return context.Canceled
	}
	return nil
}

// cancel aborts the delivery; later calls do nothing.
func (c *abort) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		return
	}
	c.aborted = true
	if c.done != nil {
		close(c.done)
	}
}
