package scheduler

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestWorkerReplies(t *testing.T) {
	tests := []struct {
		name, body, status, reason string
		code                       int
	}{
		{"2xx completes with the body as output", `{"n":1}`, "COMPLETED", "", 201},
		{"non-JSON output is kept as a string", `plain text`, "COMPLETED", "", 200},
		{"4xx is terminal", `{"error":"bad tenant"}`, "FAILED_WITH_TERMINAL_ERROR", `HTTP 422 Unprocessable Entity: {"error":"bad tenant"}`, 422},
		{"404 is terminal", ``, "FAILED_WITH_TERMINAL_ERROR", `HTTP 404 Not Found`, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorker(t, func(delivery) (int, string) { return tc.code, tc.body })
			h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { retry: { count: 3, delay: 0s } }`, ""))
			id := h.submit(`{"name":"job","input":{"x":1}}`).ID
			v := h.waitStatus(id, tc.status)
			if d := w.next(t); d.body != `{"x":1}` || d.attempt != "1" || d.id != id {
				t.Fatalf("delivery %+v", d)
			}
			if deref(v.ReasonForIncompletion) != tc.reason && tc.reason != "" {
				t.Fatalf("reason %q, want %q", deref(v.ReasonForIncompletion), tc.reason)
			}
			switch {
			case tc.status != "COMPLETED":
				if len(w.deliveries()) != 1 || v.Attempt != 1 {
					t.Fatalf("a terminal failure was retried: %d deliveries", len(w.deliveries()))
				}
			case tc.body == "plain text":
				if string(v.Output) != `"plain text"` {
					t.Fatalf("output %s", v.Output)
				}
			default:
				if string(v.Output) != tc.body {
					t.Fatalf("output %s, want %s", v.Output, tc.body)
				}
			}
		})
	}
}

// 5xx and 429 are retried with the policy's delays (exponential, no
// jitter: 10 s then 20 s), in RETRY_WAIT between attempts, then FAILED.
func TestRetryWithPolicyDelays(t *testing.T) {
	codes := []int{503, 429, 500}
	n := 0
	w := newWorker(t, func(delivery) (int, string) {
		c := codes[n%len(codes)]
		n++
		return c, "upstream down"
	})
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { retry: { count: 2, logic: exponential_backoff, delay: 10s, scale: 2, jitter: 0 } }`, ""), withFakeClock())
	id := h.submit(`{"name":"job"}`).ID
	if d := w.next(t); d.attempt != "1" {
		t.Fatalf("first delivery carries attempt %s", d.attempt)
	}
	for attempt, delay := range []time.Duration{10 * time.Second, 20 * time.Second} {
		v := h.waitStatus(id, "RETRY_WAIT")
		if v.RetryAt == nil || !v.RetryAt.Equal(h.fake.Now().Add(delay)) {
			t.Fatalf("attempt %d: retry_at %v, want now+%s", attempt+1, v.RetryAt, delay)
		}
		if !strings.HasPrefix(deref(v.ReasonForIncompletion), "HTTP 5") && !strings.HasPrefix(deref(v.ReasonForIncompletion), "HTTP 429") {
			t.Fatalf("reason %q", deref(v.ReasonForIncompletion))
		}
		h.waitUntil("the retry timer is armed", func(s *Scheduler) bool { return s.waits[mustSeq(id)] != nil })
		h.fake.Advance(delay - time.Millisecond)
		h.settle()
		if got := len(w.deliveries()); got != attempt+1 {
			t.Fatalf("retried before the delay: %d deliveries", got)
		}
		h.fake.Advance(time.Millisecond)
		if d := w.next(t); d.attempt != []string{"2", "3"}[attempt] {
			t.Fatalf("retry carries x-run-attempt %s, want %d", d.attempt, attempt+2)
		}
	}
	v := h.waitStatus(id, "FAILED")
	if v.Attempt != 3 || len(w.deliveries()) != 3 || deref(v.ReasonForIncompletion) != "HTTP 500 Internal Server Error: upstream down" {
		t.Fatalf("after the retries: attempt %d, %d deliveries, reason %q", v.Attempt, len(w.deliveries()), deref(v.ReasonForIncompletion))
	}
}

// A 429 or 503 whose Retry-After asks for longer than the policy's delay
// waits that long, up to max_delay; other statuses' Retry-After is not
// read.
func TestWorkerRetryAfter(t *testing.T) {
	tests := []struct {
		name       string
		code       int
		retryAfter string
		want       time.Duration
	}{
		{"longer than the delay", 503, "30", 30 * time.Second},
		{"429 too", 429, "30", 30 * time.Second},
		{"past max_delay", 503, "3600", time.Minute},
		{"shorter than the delay", 503, "1", 10 * time.Second},
		{"an HTTP-date", 503, t0.Add(25 * time.Second).UTC().Format(http.TimeFormat), 25 * time.Second},
		{"malformed", 503, "soon", 10 * time.Second},
		{"a 500's is not read", 500, "30", 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorker(t, func(delivery) (int, string) { return tc.code, "busy" })
			w.setHeader("Retry-After", tc.retryAfter)
			h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { retry: { count: 2, logic: fixed, delay: 10s, max_delay: 1m, jitter: 0 } }`, ""), withFakeClock())
			id := h.submit(`{"name":"job"}`).ID
			v := h.waitStatus(id, "RETRY_WAIT")
			if v.RetryAt == nil || !v.RetryAt.Equal(h.fake.Now().Add(tc.want)) {
				t.Fatalf("retry_at %v, want now (%v) + %s", v.RetryAt, h.fake.Now(), tc.want)
			}
		})
	}
}

func TestNonRetryableReasonIsNotRetried(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return 503, `card_declined` })
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { retry: { count: 5, delay: 0s, non_retryable: [card_declined] } }`, ""))
	id := h.submit(`{"name":"job"}`).ID
	h.waitStatus(id, "FAILED")
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("%d deliveries, want 1", n)
	}
}

func TestUnreachableWorkerIsRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	h := newHarness(t, policyYAML(dead, `
  definitions:
    job: { retry: { count: 1, delay: 0s } }`, ""))
	v := h.waitStatus(h.submit(`{"name":"job"}`).ID, "FAILED")
	if v.Attempt != 2 || !strings.Contains(deref(v.ReasonForIncompletion), "worker unreachable") {
		t.Fatalf("attempt %d reason %q", v.Attempt, deref(v.ReasonForIncompletion))
	}
}

func TestScheduleToStartTimeout(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: { schedule_to_start_timeout: 30s }`, ""), withFakeClock())
	first := h.submit(`{"name":"job"}`)
	w.next(t)
	h.fake.Advance(10 * time.Second)
	second := h.submit(`{"name":"job"}`)
	h.fake.Advance(29 * time.Second) // first waited 0s; second has 1s left
	if v := h.get(second.ID); v.Status != "QUEUED" {
		t.Fatalf("timed out early: %s", v.Status)
	}
	h.fake.Advance(time.Second)
	v := h.waitStatus(second.ID, "TIMED_OUT")
	if deref(v.Control) != "timeout" || !strings.Contains(deref(v.ReasonForIncompletion), "schedule_to_start_timeout 30s exceeded") ||
		!strings.Contains(deref(v.ReasonForIncompletion), "held by lanes") {
		t.Fatalf("timed out run: control %s reason %q", deref(v.Control), deref(v.ReasonForIncompletion))
	}
	g.release(first.ID)
	h.waitStatus(first.ID, "COMPLETED")
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("the timed-out run was delivered anyway (%d deliveries)", n)
	}
}

// A worker that accepted a run (202) must heartbeat within
// heartbeat_timeout; each heartbeat restarts it.
func TestHeartbeatTimeout(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return http.StatusAccepted, "" })
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { heartbeat_timeout: 30s }`, ""), withFakeClock())
	id := h.submit(`{"name":"job"}`).ID
	h.waitPhase(id, phaseAsync)
	h.fake.Advance(20 * time.Second)
	if r := h.do("POST", "/"+id+"/heartbeat", ""); r.code != 200 || r.run(t).Status != "RUNNING" {
		t.Fatalf("heartbeat: %d %s", r.code, r.body)
	}
	h.fake.Advance(20 * time.Second) // 40s after start, 20s after the heartbeat
	h.settle()
	if v := h.get(id); v.Status != "RUNNING" {
		t.Fatalf("timed out although it heartbeat 20s ago: %s %s", v.Status, deref(v.ReasonForIncompletion))
	}
	h.fake.Advance(10 * time.Second)
	v := h.waitStatus(id, "TIMED_OUT")
	if deref(v.Control) != "timeout" || !strings.Contains(deref(v.ReasonForIncompletion), "heartbeat_timeout 30s") {
		t.Fatalf("control %s reason %q", deref(v.Control), deref(v.ReasonForIncompletion))
	}
	if r := h.do("POST", "/"+id+"/heartbeat", ""); r.code != http.StatusConflict || !strings.Contains(string(r.body), "TIMED_OUT") {
		t.Fatalf("heartbeat of a timed-out run: %d %s, want 409 naming the status", r.code, r.body)
	}
	if r := h.do("POST", "/"+id+"/complete", `{"status":"COMPLETED"}`); r.code != http.StatusConflict {
		t.Fatalf("complete of a timed-out run: %d %s", r.code, r.body)
	}
}

// start_to_close bounds a synchronous delivery too: the request is
// abandoned and the run ends TIMED_OUT, its lane freed.
func TestStartToCloseTimeout(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    slow: { start_to_close_timeout: 1m }`, ""), withFakeClock())
	slow := h.submit(`{"name":"slow"}`)
	next := h.submit(`{"name":"slow"}`)
	w.next(t)
	h.waitPhase(slow.ID, phaseDelivering)
	h.fake.Advance(time.Minute)
	v := h.waitStatus(slow.ID, "TIMED_OUT")
	if !strings.Contains(deref(v.ReasonForIncompletion), "start_to_close_timeout 1m0s exceeded") {
		t.Fatalf("reason %q", deref(v.ReasonForIncompletion))
	}
	if d := w.next(t); d.id != next.ID {
		t.Fatalf("freed lane went to %s", d.id)
	}
	g.release(slow.ID)
	g.release(next.ID)
	h.waitStatus(next.ID, "COMPLETED")
	if v := h.get(slow.ID); v.Status != "TIMED_OUT" {
		t.Fatalf("a late reply changed a timed-out run to %s", v.Status)
	}
}

func TestZeroTimeoutsArmNothing(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return http.StatusAccepted, "" })
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: {}`, ""), withFakeClock())
	id := h.submit(`{"name":"job"}`).ID
	h.waitPhase(id, phaseAsync)
	if n := h.fake.Timers(); n != 0 {
		t.Fatalf("%d timers armed with every timeout 0", n)
	}
	h.fake.Advance(24 * time.Hour)
	if v := h.get(id); v.Status != "RUNNING" {
		t.Fatalf("%s after a day with no timeouts", v.Status)
	}
}

// complete ends a run the worker accepted with 202; FAILED is retried.
func TestCompleteAfterAccepted(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return http.StatusAccepted, "" })
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { retry: { count: 1, delay: 0s } }`, ""))
	id := h.submit(`{"name":"job"}`).ID
	h.waitPhase(id, phaseAsync)
	r := h.do("POST", "/"+id+"/complete", `{"status":"FAILED","reason":"disk full"}`)
	if r.code != 200 {
		t.Fatalf("complete FAILED: %d %s", r.code, r.body)
	}
	w.next(t)
	if d := w.next(t); d.attempt != "2" {
		t.Fatalf("FAILED was not retried: attempt %s", d.attempt)
	}
	h.waitPhase(id, phaseAsync)
	r = h.do("POST", "/"+id+"/complete", `{"status":"COMPLETED","output":{"rows":42}}`)
	if r.code != 200 || r.run(t).Status != "COMPLETED" {
		t.Fatalf("complete: %d %s", r.code, r.body)
	}
	v := h.get(id)
	if string(v.Output) != `{"rows":42}` || v.Attempt != 2 || v.ReasonForIncompletion != nil {
		t.Fatalf("completed run %+v", v)
	}
	if r := h.do("POST", "/"+id+"/complete", `{"status":"COMPLETED"}`); r.code != http.StatusConflict {
		t.Fatalf("second complete: %d %s, want 409", r.code, r.body)
	}
	if r := h.do("POST", "/999999/complete", `{"status":"COMPLETED"}`); r.code != http.StatusNotFound {
		t.Fatalf("complete of an unknown run: %d", r.code)
	}
}

func TestIdempotentResubmission(t *testing.T) {
	w := newWorker(t, nil)
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: {}`, ""))
	a := h.submit(`{"name":"job","input":{"v":1},"idempotency_key":"order-7"}`)
	h.waitStatus(a.ID, "COMPLETED")
	b := h.submit(`{"name":"job","input":{"v":2},"idempotency_key":"order-7"}`)
	if b.ID != a.ID || b.Status != "COMPLETED" {
		t.Fatalf("resubmission: id %s status %s, want the first run %s", b.ID, b.Status, a.ID)
	}
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("%d deliveries for one idempotency key", n)
	}
	c := h.submit(`{"name":"job","idempotency_key":"order-8"}`)
	if c.ID == a.ID {
		t.Fatal("another key returned the same run")
	}
}

func TestBadRequests(t *testing.T) {
	h := newHarness(t, policyYAML("http://127.0.0.1:9", `
  definitions:
    tenant_sync: {}
    report: {}`, ""))
	tests := []struct {
		method, path, body, want string
		code                     int
	}{
		{"POST", "", ``, "empty body", 400},
		{"POST", "", `{"name":"tenant_sync"`, "malformed JSON", 400},
		{"POST", "", `{"name":"tenant_sync",}`, "malformed JSON at byte", 400},
		{"POST", "", `[1,2]`, "must be a JSON object", 400},
		{"POST", "", `{"name":"nope"}`, `unknown definition "nope"; defined: report, tenant_sync`, 400},
		{"POST", "", `{"input":{}}`, `missing "name"`, 400},
		{"POST", "", `{"name":"report","inputs":{}}`, `unknown field "inputs" (fields: name, input, priority, idempotency_key, not_before, delay)`, 400},
		{"POST", "", `{"name":"report","not_before":"tomorrow"}`, `"not_before" "tomorrow": want an RFC 3339 time`, 400},
		{"POST", "", `{"name":"report","delay":"-5s"}`, `not negative`, 400},
		{"POST", "", `{"name":"report","delay":"5"}`, `"delay" "5": want a duration`, 400},
		{"POST", "", `{"name":"report","delay":"5s","not_before":"2026-01-01T00:00:00Z"}`, `not both`, 400},
		{"POST", "", `{"name":"report","priority":"high"}`, `field "priority": want an integer`, 400},
		{"POST", "", `{"name":"report","priority":1.5}`, `field "priority"`, 400},
		{"POST", "", `{"name":"report","input":{"a":}}`, "malformed JSON", 400},
		{"POST", "", `{"name":"report"} {}`, "unexpected data after the object", 400},
		{"POST", "", `{"name":"report","idempotency_key":""}`, `"idempotency_key" is empty`, 400},
		{"GET", "?status=DONE", ``, `unknown status "DONE"`, 400},
		{"GET", "?limit=0", ``, "limit must be", 400},
		{"GET", "/12345", ``, `run "12345" not found`, 404},
		{"GET", "/abc", ``, `not found`, 404},
		{"DELETE", "/1", ``, "not allowed", 405},
		{"POST", "/1/complete", `{"status":"DONE"}`, `want COMPLETED, FAILED or FAILED_WITH_TERMINAL_ERROR`, 400},
		{"POST", "/1/complete", `{}`, `missing "status"`, 400},
		{"POST", "/1/pause", ``, "no such endpoint", 404},
		{"POST", "/1/cancel", `{"reason":7}`, `field "reason"`, 400},
	}
	for _, tc := range tests {
		r := h.do(tc.method, tc.path, tc.body)
		var e struct{ Error string }
		jsonUnmarshal(r.body, &e)
		if r.code != tc.code || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s %s %s: %d %s, want %d containing %q", tc.method, tc.path, tc.body, r.code, r.body, tc.code, tc.want)
		}
	}
}

func TestListByStatus(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: {}`, ""))
	var ids []string
	for range 4 {
		ids = append(ids, h.submit(`{"name":"job"}`).ID)
	}
	w.next(t)
	var queued []RunView
	r := h.do("GET", "?status=QUEUED", "")
	if err := jsonUnmarshal(r.body, &queued); err != nil || len(queued) != 3 || queued[0].ID != ids[1] || deref(queued[0].Control) != "lanes" {
		t.Fatalf("QUEUED list: %s", r.body)
	}
	var running []RunView
	jsonUnmarshal(h.do("GET", "?status=RUNNING", "").body, &running)
	if len(running) != 1 || running[0].ID != ids[0] {
		t.Fatalf("RUNNING list: %+v", running)
	}
	var page []RunView
	jsonUnmarshal(h.do("GET", "?limit=2&after="+ids[0], "").body, &page)
	if len(page) != 2 || page[0].ID != ids[1] || page[1].ID != ids[2] {
		t.Fatalf("page after %s: %+v", ids[0], page)
	}
	for _, id := range ids {
		g.release(id)
	}
	h.waitStatus(ids[3], "COMPLETED")
	_ = context.Background
}

// GET {path_prefix}?name=&key= lists one definition's runs, or one key's,
// with status and paging as usual.
func TestListByNameAndKey(t *testing.T) {
	w := newWorker(t, nil)
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    sync: { key: "${input.tenant}" }
    report: {}`, ""))
	var ids []string
	for _, body := range []string{
		`{"name":"sync","input":{"tenant":"acme"}}`, `{"name":"report"}`, `{"name":"sync","input":{"tenant":"globex"}}`,
		`{"name":"sync","input":{"tenant":"acme"}}`, `{"name":"report"}`,
	} {
		ids = append(ids, h.submit(body).ID)
	}
	for _, id := range ids {
		h.waitStatus(id, "COMPLETED")
	}
	tests := []struct {
		query string
		want  []int
	}{
		{"?name=report", []int{1, 4}},
		{"?name=sync&key=acme", []int{0, 3}},
		{"?key=globex", []int{2}},
		{"?name=sync&status=COMPLETED&limit=1&after=" + ids[0], []int{2}},
		{"?name=sync&status=QUEUED", nil},
		{"?name=nope", nil},
	}
	for _, tt := range tests {
		var got []RunView
		r := h.do("GET", tt.query, "")
		if r.code != 200 || jsonUnmarshal(r.body, &got) != nil {
			t.Fatalf("%s: %d %s", tt.query, r.code, r.body)
		}
		var gotIDs, wantIDs []string
		for _, v := range got {
			gotIDs = append(gotIDs, v.ID)
		}
		for _, i := range tt.want {
			wantIDs = append(wantIDs, ids[i])
		}
		if strings.Join(gotIDs, ",") != strings.Join(wantIDs, ",") {
			t.Errorf("%s: listed %v, want %v", tt.query, gotIDs, wantIDs)
		}
	}
}
