package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/warden-dev/warden/governor/retry"
)

// Delivery is one attempt of a run handed to the worker.
type Delivery struct {
	RunID   string
	Name    string
	Attempt int
	Tenant  string
	Input   []byte
}

// Reply is the worker's answer to a delivery: a status and body, or Err
// when no answer came (connection error, timeout). RetryAfter is the wait
// a 429 or 503 asked for in its Retry-After (0: none).
type Reply struct {
	Status     int
	Body       []byte
	Err        error
	RetryAfter time.Duration
}

// DeliverFunc hands a run to the worker and waits for its answer. It must
// return when ctx ends.
type DeliverFunc func(ctx context.Context, d Delivery) Reply

// maxOutput bounds a worker's reply body kept as a run's output.
const maxOutput = 4 << 20

// maxReason bounds the body excerpt in a failure reason (SPEC §4: the
// status line plus the first 4 KiB of the body).
const maxReason = 4 << 10

// dialTimeout bounds connecting to the worker; a refused or timed-out
// connection is a retryable failure.
const dialTimeout = 5 * time.Second

func newWorkerClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               nil, // the worker is local; never through HTTP_PROXY (which may be warden's egress)
			DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		// A redirect from the worker is its answer, not somewhere to go.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// httpDeliver POSTs the run's input to {ingress.worker}{run_path} with
// x-run-id, x-run-attempt and x-tenant-id.
func (s *Scheduler) httpDeliver(ctx context.Context, d Delivery) Reply {
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return Reply{Err: errors.New("scheduler stopped")}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.worker+cfg.runPath, bytes.NewReader(d.Input))
	if err != nil {
		return Reply{Err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-run-id", d.RunID)
	req.Header.Set("x-run-attempt", strconv.Itoa(d.Attempt))
	req.Header.Set("x-run-name", d.Name)
	if d.Tenant != "" {
		req.Header.Set("x-tenant-id", d.Tenant)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Reply{Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxOutput+1))
	if err != nil {
		return Reply{Err: fmt.Errorf("read reply: %w", err)}
	}
	return Reply{Status: resp.StatusCode, Body: body,
		RetryAfter: retry.Asked(resp.StatusCode, resp.Header.Get("Retry-After"), s.clk.Now())}
}

type outcomeKind uint8

const (
	outCompleted outcomeKind = iota
	outAccepted              // 202: the worker runs it and calls complete
	outTerminal              // never retried
	outRetryable             // retried per the definition's retry policy
)

type outcome struct {
	kind   outcomeKind
	reason string
}

// classify maps a worker's reply to what happens to the run (SPEC §6):
// 202 → RUNNING until complete; other 2xx → COMPLETED; 429 and 5xx, a
// timeout or a connection error → retried; any other status → terminal.
func classify(r Reply) outcome {
	switch {
	case r.Err != nil:
		return outcome{kind: outRetryable, reason: "worker unreachable: " + r.Err.Error()}
	case r.Status == http.StatusAccepted:
		return outcome{kind: outAccepted}
	case r.Status >= 200 && r.Status < 300:
		if len(r.Body) > maxOutput {
			return outcome{kind: outTerminal, reason: fmt.Sprintf("worker output exceeds %d bytes", maxOutput)}
		}
		return outcome{kind: outCompleted}
	case r.Status == http.StatusTooManyRequests || r.Status >= 500:
		return outcome{kind: outRetryable, reason: replyReason(r)}
	}
	return outcome{kind: outTerminal, reason: replyReason(r)}
}

// replyReason is the status line plus the first 4 KiB of the body.
func replyReason(r Reply) string {
	line := fmt.Sprintf("HTTP %d %s", r.Status, http.StatusText(r.Status))
	body := bytes.TrimSpace(r.Body)
	if len(body) > maxReason {
		body = body[:maxReason]
	}
	if len(body) == 0 {
		return line
	}
	return line + ": " + string(body)
}
