package main

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// readiness is one answer of GET /readyz (code 0: no answer).
type readiness struct {
	at   time.Time // when the answer came
	sent time.Time
	code int
	body string
}

// readyzPoller asks /readyz every 100 ms while a scenario runs.
type readyzPoller struct {
	*repeater
	mu      sync.Mutex
	samples []readiness
}

func pollReadyz(ctx context.Context, w *warden) *readyzPoller {
	p := &readyzPoller{}
	// Its own client: one answer may take long while warden is starved,
	// and the sampler's scrapes should not queue behind it.
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	p.repeater = repeat(ctx, 100*time.Millisecond, func(ctx context.Context) {
		r := readiness{sent: time.Now()}
		if code, body, err := httpGet(ctx, c, "http://"+w.admin+"/readyz", 4096); err == nil {
			r.code, r.body = code, string(body)
		}
		r.at = time.Now()
		p.mu.Lock()
		p.samples = append(p.samples, r)
		p.mu.Unlock()
	})
	return p
}

// between is the answered samples sent and answered within [from, to).
func (p *readyzPoller) between(from, to time.Time) []readiness {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []readiness
	for _, r := range p.samples {
		if r.code != 0 && !r.sent.Before(from) && r.at.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// firstAfter is the first answered sample sent at or after t that
// satisfies ok, and whether there is one.
func (p *readyzPoller) firstAfter(t time.Time, ok func(readiness) bool) (readiness, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.samples {
		if r.code != 0 && !r.sent.Before(t) && ok(r) {
			return r, true
		}
	}
	return readiness{}, false
}
