package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warden-dev/warden/internal/testkit/loopback"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	// Four different mistakes: a bad window, an unknown key, an undefined
	// pool, a ratio out of range.
	os.WriteFile(bad, []byte(`version: 1
pools:
  stripe: { concurrency: 5, rate: 100, window: 45 }
targets:
  - name: stripe
    hosts: [api.stripe.com]
    retyr: {}
    pools: [strip]
    circuit_breaker: { failure_ratio: 1.5 }
`), 0o644)
	tests := []struct {
		name     string
		args     []string
		code     int
		wantOut  string
		errLines int
	}{
		{"example is valid", []string{"validate", "../../policies.example.yaml"}, 0, "policies.example.yaml: ok", 0},
		{"four mistakes, four lines", []string{"validate", bad}, 1, "", 4},
		{"missing file", []string{"validate", filepath.Join(dir, "nope.yaml")}, 1, "", 1},
		{"no file", []string{"validate"}, 2, "", -1},
	}
	loc := regexp.MustCompile(`^[^:]+:\d+:\d+: `)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, &out, &errb)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Fatalf("stdout %q lacks %q", out.String(), tc.wantOut)
			}
			if tc.errLines < 0 {
				return
			}
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			if errb.Len() == 0 {
				lines = nil
			}
			if len(lines) != tc.errLines {
				t.Fatalf("%d error lines, want %d:\n%s", len(lines), tc.errLines, errb.String())
			}
			if tc.name == "four mistakes, four lines" {
				for _, l := range lines {
					if !loc.MatchString(l) {
						t.Errorf("line %q is not FILE:LINE:COL: message", l)
					}
				}
			}
		})
	}
}

// manyErrors writes a policy with 10,000 mistakes, one per tenant
// override, and returns its path.
func manyErrors(t *testing.T) string {
	t.Helper()
	var src strings.Builder
	src.WriteString("version: 1\ningress:\n  listen: 127.0.0.1:8080\n  worker: http://127.0.0.1:9000\n  tenant: {rate: 10, window: 60}\n  tenants:\n")
	for i := range 10_000 {
		fmt.Fprintf(&src, "    t%05d: {rate: 1, window: 7}\n", i)
	}
	file := filepath.Join(t.TempDir(), "many.yaml")
	if err := os.WriteFile(file, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// firstHundred checks that lines are the first 100 errors of manyErrors'
// file, then the count of the rest.
func firstHundred(t *testing.T, lines []string) {
	t.Helper()
	if len(lines) != 101 {
		t.Fatalf("%d error lines, want 101", len(lines))
	}
	loc := regexp.MustCompile(`^[^:]+:\d+:\d+: `)
	for i, l := range lines[:100] {
		if !loc.MatchString(l) || !strings.Contains(l, fmt.Sprintf("t%05d.window", i)) {
			t.Fatalf("line %d = %q, want tenant %d's error", i, l, i)
		}
	}
	if lines[100] != "... and 9900 more errors" {
		t.Errorf("last line %q", lines[100])
	}
}

// A file with 10,000 mistakes prints the first 100 and one line counting
// the rest, whether validated or run.
func TestValidateListsTheFirstHundredErrors(t *testing.T) {
	file := manyErrors(t)
	var out, errb bytes.Buffer
	if code := run([]string{"validate", file}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	firstHundred(t, strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n"))
}

func TestRunRefusesToStartWithTheFirstHundredErrors(t *testing.T) {
	file := manyErrors(t)
	var errb bytes.Buffer
	if code := run([]string{"run", "--policy", file, "--data-dir", t.TempDir()}, io.Discard, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n")
	if !strings.Contains(lines[0], `msg="cannot start: the policy does not validate"`) || !strings.Contains(lines[0], "error_count=10000") {
		t.Fatalf("first line %q, want the one log line with the count", lines[0])
	}
	firstHundred(t, lines[1:])
}

// validate warns, without failing, of an admin listener beyond loopback
// when the environment holds no token.
func TestValidateWarnsOfAnOpenAdmin(t *testing.T) {
	const env = "WARDEN_VALIDATE_TEST_TOKEN"
	dir := t.TempDir()
	write := func(name, listen string) string {
		file := filepath.Join(dir, name)
		body := fmt.Sprintf("version: 1\nadmin: { listen: %q, token_env: %s }\n", listen, env)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	open, local := write("open.yaml", "0.0.0.0:9901"), write("local.yaml", "127.0.0.1:9901")
	for _, tc := range []struct {
		name, file, token string
		warn              bool
	}{
		{"wildcard, no token", open, "", true},
		{"wildcard, token set", open, "s3cret", false},
		{"loopback, no token", local, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(env, tc.token)
			var out, errb bytes.Buffer
			if code := run([]string{"validate", tc.file}, &out, &errb); code != 0 || !strings.HasSuffix(out.String(), ": ok\n") {
				t.Fatalf("exit %d, stdout %q: a warning must not fail validation", code, out.String())
			}
			got := errb.String()
			if !tc.warn {
				if got != "" {
					t.Fatalf("unexpected stderr %q", got)
				}
				return
			}
			if !strings.Contains(got, "open.yaml:2:18: admin.listen: 0.0.0.0:9901 is not a loopback address") ||
				!strings.Contains(got, "every admin GET (tenants, queues, metrics, policy)") || !strings.HasSuffix(got, " (warning)\n") {
				t.Fatalf("stderr %q lacks the admin warning", got)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"version"}, &out, io.Discard); code != 0 || !strings.HasPrefix(out.String(), "warden ") {
		t.Fatalf("version: exit %d output %q", code, out.String())
	}
}

// TestRunRefusesBadArguments: usage mistakes stop warden run before it
// starts anything, with exit 2 and a message naming the mistake.
func TestRunRefusesBadArguments(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no policy", []string{"run"}, "--policy FILE is required"},
		{"extra argument", []string{"run", "--policy", "a.yaml", "b.yaml"}, `unexpected argument "b.yaml"`},
		{"flag after a word", []string{"run", "--policy", "a.yaml", "now", "--log-level", "debug"}, `unexpected argument "now"`},
		{"log format", []string{"run", "--policy", "a.yaml", "--log-format", "xml"}, "--log-format"},
		{"log level", []string{"run", "--policy", "a.yaml", "--log-level", "loud"}, "--log-level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errb bytes.Buffer
			if code := run(tt.args, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, errb.String(), tt.want)
			}
		})
	}
}

// buildWarden compiles the binary once per test run.
func buildWarden(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "warden")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// process is a warden started by a test; its log lines arrive on lines.
type process struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
}

func start(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, lines: make(chan string, 1000), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// exitsZero waits up to within for the process to exit, and fails the test
// unless it exited with status 0.
func (p *process) exitsZero(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("exit %d, want 0", ee.ExitCode())
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(within):
		t.Fatalf("warden did not exit within %v", within)
	}
}

// serveHTTP serves h on a loopback port until the test ends and returns
// the address. Close does not wait for handlers, so one still blocked at
// the end of a test does not hold it.
func serveHTTP(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := &http.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// waitLog waits for a log line containing s.
func (p *process) waitLog(t *testing.T, s string) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, s) {
				return l
			}
		case err := <-p.done:
			t.Fatalf("warden exited (%v) before logging %q", err, s)
		case <-timeout:
			t.Fatalf("no log line containing %q", s)
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, nil)
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

const basePolicy = `version: 1
shutdown_grace: 5s
admin: { listen: %s, token_env: TEST_WARDEN_TOKEN }
pools:
  stripe: { concurrency: 5, rate: %d, window: 60 }
`

// TestRunLifecycle drives the real binary: admin endpoints, the token rule,
// reload on SIGHUP, on a file change and over the API, a bad file that keeps
// the running policy, and SIGTERM exiting 0.
func TestRunLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildWarden(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	addr := loopback.FreeAddr(t)
	write := func(rate int) {
		if err := os.WriteFile(file+".tmp", []byte(fmt.Sprintf(basePolicy, addr, rate)), 0o644); err != nil {
			t.Fatal(err)
		}
		// Replace atomically, the way editors and ConfigMaps do.
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write(100)
	p := start(t, bin, []string{"TEST_WARDEN_TOKEN=s3cret"}, "run", "--policy", file, "--data-dir", filepath.Join(dir, "data"), "--log-format", "text")
	p.waitLog(t, "warden running")
	base := "http://" + addr

	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz %d %s", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "warden_pool_window_count") {
		t.Fatalf("metrics %d lacks warden_ metrics", code)
	}
	if code, body := get(t, base+"/v1/pools"); code != 200 || !strings.Contains(body, `"rate": 100`) {
		t.Fatalf("pools %d %s", code, body)
	}

	// Token rule.
	if code, _ := post(t, base+"/v1/pools/reset", ""); code != 401 {
		t.Fatalf("reset without token: %d, want 401", code)
	}
	if code, _ := post(t, base+"/v1/pools/reset", "wrong"); code != 401 {
		t.Fatalf("reset with wrong token: %d, want 401", code)
	}
	if code, _ := post(t, base+"/v1/pools/stripe/reset", "s3cret"); code != 200 {
		t.Fatalf("reset with token: %d", code)
	}
	if code, _ := post(t, base+"/v1/pools/nope/reset", "s3cret"); code != 404 {
		t.Fatalf("reset of unknown pool: %d, want 404", code)
	}

	// SIGHUP after an edit made while the watcher could also see it: either
	// trigger reloads; wait for the new rate to be in force.
	write(200)
	p.waitLog(t, "policy reloaded")
	if _, body := get(t, base+"/v1/pools"); !strings.Contains(body, `"rate": 200`) {
		t.Fatalf("file change not applied: %s", body)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "policy unchanged")

	// A broken file keeps the running policy and reports why.
	os.WriteFile(file, []byte("version: 1\npools:\n  stripe: { rate: 5, window: 7 }\n"), 0o644)
	p.waitLog(t, "policy reload refused")
	if _, body := get(t, base+"/v1/pools"); !strings.Contains(body, `"rate": 200`) {
		t.Fatalf("bad file replaced the running policy: %s", body)
	}
	if _, body := get(t, base+"/v1/policy"); !strings.Contains(body, "policy.yaml:3:") || !strings.Contains(body, "window") {
		t.Fatalf("last_reload_error does not locate the mistake: %s", body)
	}
	if _, body := get(t, base+"/metrics"); !regexp.MustCompile(`warden_policy_reload_errors_total [1-9]`).MatchString(body) {
		t.Fatal("warden_policy_reload_errors_total not incremented")
	}
	if code, body := post(t, base+"/v1/policy/reload", "s3cret"); code != 422 || !strings.Contains(body, "policy.yaml:3:") {
		t.Fatalf("API reload of a bad file: %d %s", code, body)
	}

	// Fixed again, through the API. The watcher may get there first; the
	// API call serialises behind it, so either way 300 is in force after.
	write(300)
	if code, body := post(t, base+"/v1/policy/reload", "s3cret"); code != 200 {
		t.Fatalf("API reload: %d %s", code, body)
	}
	if _, body := get(t, base+"/v1/pools"); !strings.Contains(body, `"rate": 300`) {
		t.Fatalf("API reload not applied: %s", body)
	}

	p.cmd.Process.Signal(syscall.SIGTERM)
	p.exitsZero(t, 10*time.Second)
}
