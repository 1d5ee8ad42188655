package admin

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warden-dev/warden/governor/metrics"
)

func TestAuthorization(t *testing.T) {
	resets := 0
	h := func(env string) http.Handler {
		return Handler(Config{TokenEnv: env, Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Sources: Sources{ResetPools: func() { resets++ }}})
	}
	t.Setenv("ADMIN_TEST_TOKEN", "tok")
	tests := []struct {
		name   string
		env    string
		header string
		code   int
	}{
		{"no token configured disables mutations", "ADMIN_TEST_UNSET", "Bearer tok", 403},
		{"missing header", "ADMIN_TEST_TOKEN", "", 401},
		{"wrong token", "ADMIN_TEST_TOKEN", "Bearer nope", 401},
		{"not bearer", "ADMIN_TEST_TOKEN", "Basic tok", 401},
		{"right token", "ADMIN_TEST_TOKEN", "Bearer tok", 200},
		{"scheme in lower case", "ADMIN_TEST_TOKEN", "bearer tok", 200},
		{"other scheme", "ADMIN_TEST_TOKEN", "Basic tok", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := resets
			srv := httptest.NewServer(h(tc.env))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/pools/reset", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.code)
			}
			if ran := resets != before; ran != (tc.code == 200) {
				t.Fatalf("reset ran=%v with status %d", ran, tc.code)
			}
		})
	}
}

func TestListsAreArraysAndGetsNeedNoToken(t *testing.T) {
	srv := httptest.NewServer(Handler(Config{Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sources: Sources{Pools: func() any { var none []int; return none }}}))
	defer srv.Close()
	for _, path := range []string{"/v1/pools", "/v1/breakers", "/v1/tenants", "/v1/bridges", "/v1/semaphores", "/v1/queues"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "[]" {
			t.Errorf("%s: %d %q, want 200 []", path, resp.StatusCode, b)
		}
	}
}

func TestReadyzReportsDegradedWithoutFailing(t *testing.T) {
	degraded := []string{}
	var notReady error
	srv := httptest.NewServer(Handler(Config{Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sources: Sources{Ready: func() error { return notReady }, Degraded: func() []string { return degraded }}}))
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get(); code != 200 || strings.Contains(body, "degraded") {
		t.Fatalf("healthy: %d %s", code, body)
	}
	degraded = []string{"backend: redis unreachable"}
	if code, body := get(); code != 200 || !strings.Contains(body, `"degraded"`) || !strings.Contains(body, "redis unreachable") {
		t.Fatalf("degraded: %d %s", code, body)
	}
	notReady = errors.New("backend: redis unreachable")
	if code, _ := get(); code != 503 {
		t.Fatalf("not ready: %d", code)
	}
}
