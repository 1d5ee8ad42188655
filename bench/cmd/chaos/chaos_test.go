package main

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSlope(t *testing.T) {
	for _, tc := range []struct {
		name   string
		xs, ys []float64
		want   float64
		ok     bool
	}{
		{"line", []float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}, 2, true},
		{"flat", []float64{0, 1, 2}, []float64{4, 4, 4}, 0, true},
		{"noise around a rise", []float64{0, 1, 2, 3}, []float64{0, 2, 1, 3}, 0.8, true},
		{"one point", []float64{1}, []float64{1}, 0, false},
		{"no spread in x", []float64{2, 2}, []float64{1, 5}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := slope(tc.xs, tc.ys)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("slope = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestTrendPerMinute(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var us []usage
	for i := range 61 { // a minute of readings, one a second
		us = append(us, usage{at: t0.Add(time.Duration(i) * time.Second), rss: int64(10e6 + i*100e3), fds: 20, goroutines: 30 + i/10})
	}
	got := trend(us, t0)
	if math.Abs(got.rssMB-6) > 1e-6 || got.fds != 0 || math.Abs(got.goroutines-6) > 0.5 || got.n != 61 {
		t.Fatalf("trend = %+v, want 6 MB/min, 0 fds/min, about 6 goroutines/min over 61 readings", got)
	}
}

func TestSumMetric(t *testing.T) {
	body := []byte(`# HELP go_goroutines Number of goroutines.
go_goroutines 42
go_goroutines_total 7
warden_listener_refused_total{listener="ingress"} 3
warden_listener_refused_total{listener="egress"} 4
`)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"go_goroutines", nil, 42},
		{"warden_listener_refused_total", nil, 7},
		{"warden_listener_refused_total", []string{`listener="egress"`}, 4},
		{"warden_missing", nil, 0},
	} {
		if got := sumMetric(body, tc.name, tc.labels...); got != tc.want {
			t.Errorf("sumMetric(%s %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// TestHoldSlowSeesTheClose checks the slow-clients scenario's own eyes: a
// server with short header, read and idle timeouts closes each kind of
// slow connection, and holdSlow reports it closed, soon after the timeout.
func TestHoldSlowSeesTheClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = w.Write([]byte("ok"))
		}),
		ReadHeaderTimeout: 300 * time.Millisecond,
		ReadTimeout:       600 * time.Millisecond,
		IdleTimeout:       300 * time.Millisecond,
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	for _, k := range slowKinds {
		t.Run(k.name, func(t *testing.T) {
			r := holdSlow(context.Background(), k, ln.Addr().String(), "h", 10*time.Second)
			if !r.closed || r.after > 5*time.Second {
				t.Fatalf("%+v: want closed by the server within 5 s", r)
			}
		})
	}
}

func TestRenderNamesFailures(t *testing.T) {
	ok, bad := newRow("good"), newRow("bad")
	ok.check("holds", true, "fine")
	bad.check("breaks", false, "a\nmultiline   detail")
	table := render([]*row{ok, bad}, "short")
	for _, want := range []string{"PASS", "FAIL: breaks", "bad/breaks", "a multiline detail"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if ok.passed() != true || bad.passed() != false || newRow("empty").passed() {
		t.Fatal("passed(): a row passes only with checks, all of them held")
	}
}
