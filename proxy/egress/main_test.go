package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// t0 is mid-minute so that 60 s windows have room on both sides.
var t0 = time.Date(2026, 3, 2, 10, 0, 20, 0, time.UTC)

type fixture struct {
	eg   *Egress
	gov  *fasttest.Governor
	clk  *clock.Fake
	addr string
}

// egressPolicy wraps an egress body (allow_unlisted, tenant, ...) and the
// targets/pools sections into a policy listening on a free port.
func egressPolicy(egress, rest string) string {
	return "version: 1\negress:\n  http_listen: 127.0.0.1:0\n" + egress + "\n" + rest
}

func start(t *testing.T, yaml string, tlsConf *tls.Config) *fixture {
	t.Helper()
	f := &fixture{clk: clock.NewFake(t0)}
	gov, ctl := fasttest.NewGovernor(t, f.clk, yaml)
	f.gov = gov
	f.eg = New(Options{Clock: f.clk, Metrics: gov.Metrics, TLS: tlsConf})
	if err := f.eg.Apply(context.Background(), ctl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.eg.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	f.addr = f.eg.Addr()
	return f
}

func (f *fixture) reload(t *testing.T, yaml string) {
	t.Helper()
	if err := f.eg.Apply(context.Background(), f.gov.Load(t, yaml)); err != nil {
		t.Fatal(err)
	}
}

// client sends requests through the egress as HTTP_PROXY would.
func (f *fixture) client() *http.Client {
	proxy, _ := url.Parse("http://" + f.addr)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: false}, Timeout: 20 * time.Second}
}

type reply struct {
	status int
	header http.Header
	body   string
}

// do sends method url through the egress with headers.
func (f *fixture) do(t *testing.T, method, target string, hdr map[string]string) reply {
	t.Helper()
	r, err := f.try(method, target, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// try is do for goroutines other than the test's: errors are returned (as
// status 0 with the error in the body when ignored).
func (f *fixture) try(method, target string, hdr map[string]string) (reply, error) {
	req, err := http.NewRequest(method, target, nil)
	if err != nil {
		return reply{}, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := f.client()
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return reply{body: err.Error()}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

// goDo is try in a new goroutine; the reply arrives on the channel.
func (f *fixture) goDo(method, target string, hdr map[string]string) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		r, _ := f.try(method, target, hdr)
		ch <- r
	}()
	return ch
}

func target(name string, hosts []string, upstream, extra string) string {
	s := fmt.Sprintf("  - name: %s\n    hosts: [%s]\n", name, strings.Join(hosts, ", "))
	if upstream != "" {
		s += "    upstream: " + upstream + "\n"
	}
	if extra != "" {
		for _, line := range strings.Split(strings.TrimSpace(extra), "\n") {
			s += "    " + strings.TrimSpace(line) + "\n"
		}
	}
	return s
}
