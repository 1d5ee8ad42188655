package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/scheduler"
)

// The runs API mounted on the ingress takes the bodies the scheduler
// takes: a submit or a complete up to scheduler.MaxBody (a 2 MB input, a
// 2 MB output) is served, and a body over it is a 400 naming the limit,
// as the scheduler words its own body errors (SPEC §6: busy or big never
// means 413). The ingress and the scheduler must not disagree on the
// limit, so this goes through the app that wires them together.
func TestRunsAPIBodyLimit(t *testing.T) {
	worker, delivered := acceptingWorker(t)
	a := startApp(t, fmt.Sprintf(`version: 1
admin: { listen: "127.0.0.1:0" }
ingress: { listen: "127.0.0.1:0", worker: %q }
scheduler:
  lanes: 5
  store: { kind: memory }
  definitions:
    job: {}
`, worker.URL), "", clock.Real{})
	addr := a.ingressAddr()
	base := "http://" + addr + "/v1/runs"

	// body is a submit or complete body of n bytes in all.
	body := func(pre string, n int) string {
		return pre + `"` + strings.Repeat("a", n-len(pre)-4) + `"}}`
	}
	const (
		submit   = `{"name":"job","input":{"blob":`
		complete = `{"status":"COMPLETED","output":{"blob":`
		big      = 2 << 20 // over the old 1 MiB mount limit, under MaxBody
	)
	limit := fmt.Sprintf("the limit is %d", scheduler.MaxBody)
	tests := []struct {
		name   string
		path   string // after /v1/runs; "{id}" is a run accepted by the worker
		body   string
		send   string // how a body over the limit goes: "length" announced, or "chunked"
		code   int
		errHas string
	}{
		{name: "submit 2 MB", body: body(submit, big), code: http.StatusAccepted},
		{name: "complete 2 MB", path: "/{id}/complete", body: body(complete, big), code: http.StatusOK},
		{name: "submit at the limit", body: body(submit, scheduler.MaxBody), code: http.StatusAccepted},
		{name: "submit over the limit", body: body(submit, scheduler.MaxBody+1), send: "length", code: http.StatusBadRequest,
			errHas: fmt.Sprintf("body is %d bytes; %s", scheduler.MaxBody+1, limit)},
		{name: "submit over the limit, chunked", body: body(submit, scheduler.MaxBody+1), send: "chunked",
			code: http.StatusBadRequest, errHas: limit},
		{name: "complete over the limit", path: "/{id}/complete", body: body(complete, scheduler.MaxBody+1), send: "length",
			code: http.StatusBadRequest, errHas: limit},
		{name: "submit at twice the limit", body: body(submit, 2*scheduler.MaxBody), send: "length", code: http.StatusBadRequest,
			errHas: limit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			var id string
			if strings.Contains(path, "{id}") {
				id = submitAccepted(t, base, delivered)
				path = strings.Replace(path, "{id}", id, 1)
			}
			var resp *http.Response
			var got []byte
			switch tc.send {
			case "length":
				// Announced too large and sent whole, as clients do: the
				// refusal must reach the client, not a connection reset
				// because the rest of its body went unread.
				resp, got = fasttest.Raw(t, addr, fmt.Sprintf("POST /v1/runs%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s",
					path, len(tc.body), tc.body))
			case "chunked":
				var b strings.Builder
				for rest := tc.body; rest != ""; {
					n := min(len(rest), 64<<10)
					fmt.Fprintf(&b, "%x\r\n%s\r\n", n, rest[:n])
					rest = rest[n:]
				}
				resp, got = fasttest.Raw(t, addr, "POST /v1/runs"+path+" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+b.String()+"0\r\n\r\n")
			default:
				r, err := http.Post(base+path, "application/json", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				got, _ = io.ReadAll(r.Body)
				r.Body.Close()
				resp = r
			}
			if resp.StatusCode != tc.code {
				t.Fatalf("%d %.200s, want %d", resp.StatusCode, got, tc.code)
			}
			if tc.errHas != "" {
				var e struct{ Error string }
				if err := json.Unmarshal(got, &e); err != nil || !strings.Contains(e.Error, tc.errHas) ||
					resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("refusal %s (%s), want a JSON error containing %q", got, resp.Header.Get("Content-Type"), tc.errHas)
				}
			}
			if id == "" {
				return
			}
			want := "RUNNING" // refused: the run is still the worker's
			if tc.code == http.StatusOK {
				want = "COMPLETED"
			}
			if code, view := getStatus(t, base+"/"+id); code != 200 || !strings.Contains(view, `"status":"`+want+`"`) {
				t.Fatalf("run %s after the complete: %d %.200s, want %s", id, code, view, want)
			}
		})
	}
}

// acceptingWorker is a worker that takes every run delivered to it (202:
// the run is completed through the API) and reports its id.
func acceptingWorker(t *testing.T) (*httptest.Server, <-chan string) {
	delivered := make(chan string, 8)
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		delivered <- r.Header.Get("x-run-id")
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(worker.Close)
	return worker, delivered
}

// submitAccepted submits a run and waits until the worker has it.
func submitAccepted(t *testing.T, base string, delivered <-chan string) string {
	t.Helper()
	want := submitRun(t, base, `{"name":"job"}`)
	for {
		select {
		case id := <-delivered:
			if id == want {
				return id
			}
		case <-time.After(10 * time.Second): // a failure bound, not a wait
			t.Fatalf("run %s never reached the worker", want)
		}
	}
}

// submitRun posts a submit body to the runs API at url and returns the
// id of the run its 202 names.
func submitRun(t *testing.T, url, body string) string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rc struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&rc); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %d %v", resp.StatusCode, err)
	}
	return rc.ID
}
