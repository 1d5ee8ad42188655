package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/pool"
)

func TestAuthorization(t *testing.T) {
	resets := 0
	h := func(env string) http.Handler {
		return New(Config{TokenEnv: env, Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Sources: Sources{ResetPools: func() { resets++ }}})
	}
	t.Setenv("ADMIN_TEST_TOKEN", "tok")
	t.Setenv("ADMIN_TEST_TOKEN_NL", " tok\n")
	t.Setenv("ADMIN_TEST_TOKEN_BLANK", " \n")
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
		{"spaces after the scheme", "ADMIN_TEST_TOKEN", "Bearer   tok", 200},
		{"no token after the scheme", "ADMIN_TEST_TOKEN", "Bearer  ", 401},
		{"token read with a trailing newline", "ADMIN_TEST_TOKEN_NL", "Bearer tok", 200},
		{"whitespace-only token disables mutations", "ADMIN_TEST_TOKEN_BLANK", "Bearer  ", 403},
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
	srv := httptest.NewServer(New(Config{Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sources: Sources{Pools: func() []pool.Snapshot { return nil }}}))
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
	srv := httptest.NewServer(New(Config{Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
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

// POST /v1/policy/reload answers by what is in force afterwards: 200 when
// the reloaded policy is (with its components' errors if some kept their
// previous settings), 422 when nothing changed.
func TestReloadAnswers(t *testing.T) {
	t.Setenv("ADMIN_TEST_TOKEN", "tok")
	t.Setenv("ADMIN_TEST_TOKEN_NL", " tok\n")
	t.Setenv("ADMIN_TEST_TOKEN_BLANK", " \n")
	tests := []struct {
		name   string
		err    error
		code   int
		status string
		errors []string
	}{
		{"applied", nil, 200, "applied", nil},
		{"applied with errors", &PartialApplyError{Err: errors.Join(errors.New("egress: bind: address already in use"), errors.New("admin listener: bind"))},
			200, "applied_with_errors", []string{"egress: bind: address already in use", "admin listener: bind"}},
		{"wrapped partial", fmt.Errorf("reload: %w", &PartialApplyError{Err: errors.New("bridges: bind")}), 200, "applied_with_errors", []string{"reload: bridges: bind"}},
		{"rejected", errors.New("p.yaml:2:3: pools.a.window: must be 1, 60, 3600 or 86400\np.yaml:3:1: unknown key"),
			422, "rejected", []string{"p.yaml:2:3: pools.a.window: must be 1, 60, 3600 or 86400", "p.yaml:3:1: unknown key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(New(Config{TokenEnv: "ADMIN_TEST_TOKEN", Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Sources: Sources{
					Reload: func() error { return tc.err },
					Policy: func() PolicyStatus { return PolicyStatus{Hash: "h1", Warnings: []string{}} },
				}}))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/policy/reload", nil)
			req.Header.Set("Authorization", "Bearer tok")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Status string   `json:"status"`
				Errors []string `json:"errors"`
				Hash   string   `json:"hash"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.code || body.Status != tc.status || !slices.Equal(body.Errors, tc.errors) {
				t.Fatalf("got %d %+v, want %d %s %q", resp.StatusCode, body, tc.code, tc.status, tc.errors)
			}
			if applied := body.Hash == "h1"; applied != (tc.code == 200) {
				t.Fatalf("policy status in the answer: %v, want it with every 200", applied)
			}
		})
	}
}

// The token is read when the policy is applied (New, SetTokenEnv), not per
// request: what was checked is what the applied policy named.
func TestTokenIsReadWhenApplied(t *testing.T) {
	t.Setenv("ADMIN_TEST_TOKEN", "first")
	api := New(Config{TokenEnv: "ADMIN_TEST_TOKEN", Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sources: Sources{ResetPools: func() {}}})
	srv := httptest.NewServer(api)
	defer srv.Close()
	steps := []struct {
		name  string
		apply func()
		codes map[string]int // bearer token → status
	}{
		{"at New", func() {}, map[string]int{"first": 200, "second": 401}},
		{"variable changed, not applied", func() { t.Setenv("ADMIN_TEST_TOKEN", "second") }, map[string]int{"first": 200, "second": 401}},
		{"applied", func() { api.SetTokenEnv("ADMIN_TEST_TOKEN") }, map[string]int{"first": 401, "second": 200}},
		{"unset variable", func() { api.SetTokenEnv("ADMIN_TEST_UNSET") }, map[string]int{"first": 403, "second": 403}},
		{"no variable", func() { api.SetTokenEnv("") }, map[string]int{"first": 403, "second": 403}},
	}
	for _, s := range steps {
		s.apply()
		for tok, want := range s.codes {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/pools/reset", nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("%s: bearer %s: %d, want %d", s.name, tok, resp.StatusCode, want)
			}
		}
	}
}
