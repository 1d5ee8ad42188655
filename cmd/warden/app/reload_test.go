package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// reloadTokenEnv names the admin token variable of these tests' policies.
const reloadTokenEnv = "WARDEN_RELOAD_TEST_TOKEN"

func egressPolicy(listen string, allowUnlisted bool) string {
	return fmt.Sprintf(`version: 1
admin: { listen: "127.0.0.1:0", token_env: %s }
egress: { http_listen: %q, allow_unlisted: %t }
`, reloadTokenEnv, listen, allowUnlisted)
}

// takenAddr holds a loopback port open until the returned func frees it.
func takenAddr(t *testing.T) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), func() { ln.Close() }
}

type policyStatus struct {
	Hash            string `json:"hash"`
	LastReloadError string `json:"last_reload_error"`
	ApplyError      string `json:"apply_error"`
}

func getPolicy(t *testing.T, in *instance) policyStatus {
	t.Helper()
	var st policyStatus
	if err := json.Unmarshal([]byte(getBody(t, "http://"+in.AdminAddr()+"/v1/policy")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func metricValue(t *testing.T, in *instance, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(getBody(t, "http://"+in.AdminAddr()+"/metrics"))
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	return m[1]
}

// unlistedStatus is the egress's answer to a host no target matches.
func unlistedStatus(t *testing.T, in *instance, url string) int {
	t.Helper()
	resp, err := proxyClient(t, in).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A reload the egress cannot apply (its new address is taken) puts the
// rest of the policy in force, is counted and reported as an error until a
// reload applies cleanly, and a reload of the same file tries the egress
// again, so freeing the port is enough.
func TestReloadRetriesWhatFailedToApply(t *testing.T) {
	t.Setenv(reloadTokenEnv, "tok")
	target := newUpstream(t, 0)
	in := startApp(t, egressPolicy("127.0.0.1:0", true), "", clock.Real{})
	oldEgress := in.egressAddr()
	busy, free := takenAddr(t)

	writePolicy(t, in.file, egressPolicy(busy, false))
	if err := in.Reload(); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("reload onto a taken address: %v", err)
	}
	st := getPolicy(t, in)
	if st.LastReloadError == "" || !strings.Contains(st.ApplyError, "address already in use") {
		t.Fatalf("/v1/policy after a failed apply: %+v", st)
	}
	if in.egressAddr() != oldEgress || unlistedStatus(t, in, target.URL) != 200 {
		t.Fatal("the egress did not keep its previous address and settings")
	}
	if got := metricValue(t, in, "warden_policy_reload_errors_total"); got != "1" {
		t.Fatalf("warden_policy_reload_errors_total = %s after a failed apply, want 1", got)
	}

	// The same file again: tried again, still failing, still reported.
	if err := in.Reload(); err == nil {
		t.Fatal("a repeated reload of a policy not in force reported success")
	}
	if st := getPolicy(t, in); !strings.Contains(st.LastReloadError, "address already in use") {
		t.Fatalf("repeated reload cleared the error: %+v", st)
	}
	// Over the API: the policy is in force but the egress is not, which
	// the answer says.
	code, body := post(t, "http://"+in.AdminAddr()+"/v1/policy/reload", "tok")
	if code != 200 || !strings.Contains(body, `"applied_with_errors"`) || !strings.Contains(body, "address already in use") {
		t.Fatalf("POST /v1/policy/reload with a taken address: %d %s", code, body)
	}

	// An invalid file meanwhile: its errors are the last reload's, and the
	// running policy's apply error stays visible.
	writePolicy(t, in.file, "version: 1\negress: { http_listen: nope }\n")
	if err := in.Reload(); err == nil {
		t.Fatal("invalid policy accepted")
	}
	if st := getPolicy(t, in); !strings.Contains(st.LastReloadError, "p.yaml:2:") || !strings.Contains(st.ApplyError, "address already in use") {
		t.Fatalf("after an invalid file: %+v", st)
	}
	if got := metricValue(t, in, "warden_policy_reload_errors_total"); got != "4" {
		t.Fatalf("warden_policy_reload_errors_total = %s, want 4", got)
	}

	writePolicy(t, in.file, egressPolicy(busy, false))
	free()
	if err := in.Reload(); err != nil {
		t.Fatalf("reload once the port is free: %v", err)
	}
	if in.egressAddr() != busy || unlistedStatus(t, in, target.URL) != http.StatusForbidden {
		t.Fatalf("egress on %s after the retry, want %s with allow_unlisted false", in.egressAddr(), busy)
	}
	if st := getPolicy(t, in); st.LastReloadError != "" || st.ApplyError != "" {
		t.Fatalf("errors left after a clean reload: %+v", st)
	}
	// Now in force: the same file is unchanged.
	code, body = post(t, "http://"+in.AdminAddr()+"/v1/policy/reload", "tok")
	if code != 200 || !strings.Contains(body, `"status": "applied"`) {
		t.Fatalf("POST /v1/policy/reload of the policy in force: %d %s", code, body)
	}
	if got := metricValue(t, in, "warden_policy_reload_errors_total"); got != "4" {
		t.Fatalf("warden_policy_reload_errors_total = %s after clean reloads, want 4", got)
	}
}

// Moving the admin listener to a taken address keeps it where it was and
// says why; once the address is free a reload moves it, even one sent to
// the listener being moved, and removing the admin section stops it.
func TestAdminListenerMoves(t *testing.T) {
	t.Setenv(reloadTokenEnv, "tok")
	adminPolicy := func(listen string) string {
		return fmt.Sprintf("version: 1\nadmin: { listen: %q, token_env: %s }\n", listen, reloadTokenEnv)
	}
	in := startApp(t, adminPolicy("127.0.0.1:0"), "", clock.Real{})
	old := in.AdminAddr()
	busy, free := takenAddr(t)

	writePolicy(t, in.file, adminPolicy(busy))
	if err := in.Reload(); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("admin moved onto a taken address: %v", err)
	}
	if in.AdminAddr() != old {
		t.Fatalf("admin listener on %q after a failed move, want %s", in.AdminAddr(), old)
	}
	if st := getPolicy(t, in); !strings.Contains(st.ApplyError, "address already in use") {
		t.Fatalf("/v1/policy does not report the failed move: %+v", st)
	}

	// Freed: the reload arrives on the old listener, which answers it
	// while the new one takes over.
	free()
	if code, body := post(t, "http://"+old+"/v1/policy/reload", "tok"); code != 200 || !strings.Contains(body, `"status": "applied"`) {
		t.Fatalf("POST /v1/policy/reload moving the admin listener: %d %s", code, body)
	}
	if in.AdminAddr() != busy {
		t.Fatalf("admin listener on %q, want %s", in.AdminAddr(), busy)
	}
	if code, _ := getStatus(t, "http://"+busy+"/healthz"); code != 200 {
		t.Fatalf("moved admin listener answers %d", code)
	}
	fasttest.WaitFor(t, "the old admin address to close", func() bool {
		c, err := net.Dial("tcp", old)
		if err == nil {
			c.Close()
		}
		return err != nil
	})

	writePolicy(t, in.file, "version: 1\n")
	if code, body := post(t, "http://"+busy+"/v1/policy/reload", "tok"); code != 200 {
		t.Fatalf("POST /v1/policy/reload removing the admin listener: %d %s", code, body)
	}
	if in.AdminAddr() != "" {
		t.Fatalf("admin listener on %q after its section was removed", in.AdminAddr())
	}
}

// The admin token follows every reload that changes admin.token_env: a
// token can be rotated by pointing token_env at another variable, and
// mutating calls disabled by pointing it at an unset one.
func TestAdminTokenFollowsReload(t *testing.T) {
	t.Setenv("WARDEN_RELOAD_TOKEN_A", "a-tok")
	t.Setenv("WARDEN_RELOAD_TOKEN_B", "b-tok")
	t.Setenv("WARDEN_RELOAD_TOKEN_UNSET", "")
	policy := func(env string) string {
		return fmt.Sprintf("version: 1\nadmin: { listen: \"127.0.0.1:0\", token_env: %s }\n", env)
	}
	in := startApp(t, policy("WARDEN_RELOAD_TOKEN_A"), "", clock.Real{})
	steps := []struct {
		tokenEnv string
		codes    map[string]int // bearer token → status of POST /v1/pools/reset
	}{
		{"WARDEN_RELOAD_TOKEN_A", map[string]int{"a-tok": 200, "b-tok": 401}},
		{"WARDEN_RELOAD_TOKEN_B", map[string]int{"a-tok": 401, "b-tok": 200}},
		{"WARDEN_RELOAD_TOKEN_UNSET", map[string]int{"a-tok": 403, "b-tok": 403}},
		{"WARDEN_RELOAD_TOKEN_A", map[string]int{"a-tok": 200, "b-tok": 401}},
	}
	for i, s := range steps {
		if i > 0 {
			writePolicy(t, in.file, policy(s.tokenEnv))
			if err := in.Reload(); err != nil {
				t.Fatal(err)
			}
		}
		for tok, want := range s.codes {
			if code, body := post(t, "http://"+in.AdminAddr()+"/v1/pools/reset", tok); code != want {
				t.Errorf("token_env %s, bearer %s: %d %s, want %d", s.tokenEnv, tok, code, body, want)
			}
		}
	}
}

func post(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// recorder keeps the log records whose message starts with prefix.
type recorder struct {
	prefix string
	mu     *sync.Mutex
	recs   *[]slog.Record
}

func (r recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r recorder) WithGroup(string) slog.Handler            { return r }

func (r recorder) Handle(_ context.Context, rec slog.Record) error {
	if strings.HasPrefix(rec.Message, r.prefix) {
		r.mu.Lock()
		*r.recs = append(*r.recs, rec)
		r.mu.Unlock()
	}
	return nil
}

func (r recorder) records() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.recs)
}

// A refused reload of a file with 10,000 errors is one log line with the
// count and the first 100, and /v1/policy, the 422 answer and the metric
// carry no more than that.
func TestRefusedReloadReportsTheFirstHundredErrors(t *testing.T) {
	t.Setenv(reloadTokenEnv, "tok")
	refusals := recorder{prefix: "policy reload refused", mu: &sync.Mutex{}, recs: &[]slog.Record{}}
	running := fmt.Sprintf("version: 1\nadmin: { listen: \"127.0.0.1:0\", token_env: %s }\n", reloadTokenEnv)
	in := startAppWith(t, running, Options{Clock: clock.Real{}, Log: slog.New(refusals)})
	hash := getPolicy(t, in).Hash

	var bad strings.Builder
	bad.WriteString(running + "ingress:\n  listen: 127.0.0.1:0\n  worker: http://127.0.0.1:9\n  tenant: {rate: 10, window: 60}\n  tenants:\n")
	for i := range 10_000 {
		fmt.Fprintf(&bad, "    t%05d: {rate: 1, window: 7}\n", i)
	}
	writePolicy(t, in.file, bad.String())
	wantLines := func(t *testing.T, where string, lines []string) {
		t.Helper()
		if len(lines) != 101 || !strings.Contains(lines[0], "p.yaml:8:") || !strings.Contains(lines[99], "t00099.window") || lines[100] != "... and 9900 more errors" {
			t.Fatalf("%s: %d lines, want 100 errors and the count of the rest; first %q, last %q", where, len(lines), lines[0], lines[len(lines)-1])
		}
	}

	if err := in.Reload(); err == nil {
		t.Fatal("a policy with 10,000 errors was accepted")
	}
	refused := refusals.records()
	if len(refused) != 1 {
		t.Fatalf("%d log lines for one refused reload, want 1", len(refused))
	}
	attrs := map[string]slog.Value{}
	refused[0].Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
	if n := attrs["error_count"]; n.Kind() != slog.KindInt64 || n.Int64() != 10_000 {
		t.Errorf("error_count = %v, want 10000", n)
	}
	logged, _ := attrs["errors"].Any().([]string)
	wantLines(t, "log", logged)

	st := getPolicy(t, in)
	if st.Hash != hash {
		t.Fatal("the refused policy was put in force")
	}
	wantLines(t, "last_reload_error", strings.Split(st.LastReloadError, "\n"))

	code, body := post(t, "http://"+in.AdminAddr()+"/v1/policy/reload", "tok")
	var answer struct {
		Status string   `json:"status"`
		Errors []string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || code != http.StatusUnprocessableEntity || answer.Status != "rejected" {
		t.Fatalf("POST /v1/policy/reload: %d %.200s (%v)", code, body, err)
	}
	wantLines(t, "422 body", answer.Errors)
	if got := metricValue(t, in, "warden_policy_reload_errors_total"); got != "2" {
		t.Errorf("warden_policy_reload_errors_total = %s after two refused reloads, want 2", got)
	}
}

// What parsing a large file took is given back to the OS when the reload
// ends, not held until the scavenger gets to it.
func TestReloadReturnsParseMemory(t *testing.T) {
	in := startApp(t, "version: 1\nadmin: { listen: \"127.0.0.1:0\" }\n", "", clock.Real{})
	var bad strings.Builder
	bad.WriteString("version: 1\ningress:\n  listen: 127.0.0.1:0\n  worker: http://127.0.0.1:9\n  tenant: {rate: 10, window: 60}\n  tenants:\n")
	for i := range 50_000 {
		fmt.Fprintf(&bad, "    t%05d: {rate: 1, window: 7}\n", i)
	}
	writePolicy(t, in.file, bad.String())
	// Held from the OS: heap spans in use or idle but not released.
	held := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapSys - m.HeapReleased
	}
	before := held()
	if err := in.Reload(); err == nil {
		t.Fatal("a policy with 50,000 errors was accepted")
	}
	if after := held(); after > before+16<<20 {
		t.Errorf("the process holds %d MiB more heap after the reload than before (%d MiB); want under 16", (after-before)>>20, before>>20)
	}
}
