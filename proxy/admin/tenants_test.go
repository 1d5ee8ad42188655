package admin

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/scheduler"
)

// tenantsAPI serves the admin API over an ingress tenant cap holding n
// tenants, tenant i counted 1 + i%5 times, plus "busy" counted 9 times.
func tenantsAPI(t *testing.T, n int) *httptest.Server {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 10, 0, time.UTC))
	caps := []*tenant.Caps{tenant.New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1000, Window: 60, MaxKeys: 1 << 20},
		nil, window.NewMemory(clk), nil)}
	for i := range n {
		for range 1 + i%5 {
			caps[0].Check([]byte("t"+strconv.Itoa(i)), clk.Now())
		}
	}
	for range 9 {
		caps[0].Check([]byte("busy"), clk.Now())
	}
	srv := httptest.NewServer(New(Config{Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sources: Sources{
			Tenants: func(limit int, after *tenant.Cursor) ([]tenant.Usage, *tenant.Cursor) {
				return tenant.List(caps, limit, after, clk.Now())
			},
			Tenant: func(name string) []tenant.Usage { return tenant.Find(caps, name, clk.Now()) },
		}}))
	t.Cleanup(srv.Close)
	return srv
}

type tenantsPage struct {
	code int
	rows []tenant.Usage
	next string // the Link header's target
	body []byte
}

var nextLink = regexp.MustCompile(`^<(/v1/tenants\?[^>]*)>; rel="next"$`)

func getTenants(t *testing.T, srv *httptest.Server, path string) tenantsPage {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := tenantsPage{code: resp.StatusCode}
	p.body, _ = io.ReadAll(resp.Body)
	if p.code != http.StatusOK {
		return p
	}
	if err := json.Unmarshal(p.body, &p.rows); err != nil {
		t.Fatalf("GET %s: body is not an array of rows: %v\n%s", path, err, p.body)
	}
	if l := resp.Header.Get("Link"); l != "" {
		m := nextLink.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("GET %s: Link %q", path, l)
		}
		p.next = m[1]
	}
	return p
}

func TestTenantsPages(t *testing.T) {
	srv := tenantsAPI(t, 250)
	first := getTenants(t, srv, "/v1/tenants")
	if len(first.rows) != tenant.DefaultListLimit || first.next == "" || first.rows[0].Tenant != "busy" || first.rows[0].Count != 9 {
		t.Fatalf("first page: %d rows, next %q, top %+v", len(first.rows), first.next, first.rows[0])
	}
	seen := map[string]bool{}
	total, path := 0, "/v1/tenants?limit=60"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("no end to the pages")
		}
		p := getTenants(t, srv, path)
		if p.code != 200 || len(p.rows) > 60 {
			t.Fatalf("GET %s: %d, %d rows", path, p.code, len(p.rows))
		}
		for _, u := range p.rows {
			if seen[u.Tenant] {
				t.Fatalf("%s listed twice", u.Tenant)
			}
			seen[u.Tenant] = true
		}
		total += len(p.rows)
		path = p.next
	}
	if total != 251 {
		t.Fatalf("the pages listed %d tenants, want 251", total)
	}
	if p := getTenants(t, srv, "/v1/tenants?limit=1000"); len(p.rows) != 251 || p.next != "" {
		t.Fatalf("limit 1000: %d rows, next %q", len(p.rows), p.next)
	}
}

func TestTenantsLookup(t *testing.T) {
	srv := tenantsAPI(t, 10)
	p := getTenants(t, srv, "/v1/tenants?tenant=t3")
	if len(p.rows) != 1 || p.rows[0].Tenant != "t3" || p.rows[0].Count != 4 || p.rows[0].Listener != "ingress" || p.next != "" {
		t.Fatalf("tenant=t3: %+v, next %q", p.rows, p.next)
	}
	if p := getTenants(t, srv, "/v1/tenants?tenant=nobody"); p.code != 200 || strings.TrimSpace(string(p.body)) != "[]" {
		t.Fatalf("tenant=nobody: %d %s", p.code, p.body)
	}
}

func TestTenantsBadQueries(t *testing.T) {
	srv := tenantsAPI(t, 3)
	for _, q := range []string{"limit=0", "limit=1001", "limit=abc", "limit=", "limit=-1", "limit=1e3"} {
		p := getTenants(t, srv, "/v1/tenants?"+q)
		if p.code != 400 || !strings.Contains(string(p.body), "limit must be an integer from 1 to 1000") {
			t.Errorf("%s: %d %s", q, p.code, p.body)
		}
	}
	for _, q := range []string{"after=", "after=%21%21", "after=MTI"} {
		p := getTenants(t, srv, "/v1/tenants?"+q)
		if p.code != 400 || !strings.Contains(string(p.body), "after must be") {
			t.Errorf("%s: %d %s", q, p.code, p.body)
		}
	}
}

// However many tenants there are, a page is its limit's rows: with 100,000
// tenants the default page is 100 of them, a few tens of kilobytes.
func TestTenantsAnswerIsBoundedByItsLimit(t *testing.T) {
	srv := tenantsAPI(t, 100_000)
	p := getTenants(t, srv, "/v1/tenants")
	if len(p.rows) != 100 || len(p.body) > 100*300 {
		t.Fatalf("%d rows in %d bytes", len(p.rows), len(p.body))
	}
	t.Logf("100 of 100,001 tenants: %d bytes", len(p.body))
}

// Lists are written one element at a time in the bytes json.Encoder with a
// two-space indent writes for the whole array; nil and empty lists are [].
func TestWriteListMatchesTheEncoder(t *testing.T) {
	type row struct {
		Name string            `json:"name"`
		N    int               `json:"n"`
		M    map[string]uint64 `json:"m"`
	}
	encoded := func(v any) string {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	rows := []row{{"a<b>", 1, map[string]uint64{"x": 1}}, {"caf\xe9", 2, nil}}
	tests := []struct {
		name  string
		write func(w http.ResponseWriter)
		want  string
	}{
		{"rows", func(w http.ResponseWriter) { writeList(w, 200, rows) }, encoded(rows)},
		{"ints", func(w http.ResponseWriter) { writeList(w, 200, []int{1}) }, encoded([]int{1})},
		{"empty", func(w http.ResponseWriter) { writeList(w, 200, []row{}) }, "[]\n"},
		{"nil", func(w http.ResponseWriter) { writeList[row](w, 200, nil) }, "[]\n"},
	}
	for _, tc := range tests {
		rec := httptest.NewRecorder()
		tc.write(rec)
		if rec.Body.String() != tc.want || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s:\n%s\nwant\n%s", tc.name, rec.Body, tc.want)
		}
	}
}

// writeSizes is a ResponseWriter that records the size of each write.
type writeSizes struct {
	httptest.ResponseRecorder
	sizes []int
}

func (w *writeSizes) Write(b []byte) (int, error) {
	w.sizes = append(w.sizes, len(b))
	return len(b), nil
}

// Every list view goes out element by element: no write carries more than
// one element, so an answer never sits whole in memory.
func TestListsAreWrittenElementByElement(t *testing.T) {
	rows := make([]scheduler.SemaphoreState, 1000)
	for i := range rows {
		rows[i] = scheduler.SemaphoreState{Name: "row-" + strconv.Itoa(i), Permits: i}
	}
	api := New(Config{Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sources: Sources{Semaphores: func() []scheduler.SemaphoreState { return rows }}})
	w := &writeSizes{ResponseRecorder: *httptest.NewRecorder()}
	api.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/semaphores", nil))
	total := 0
	for _, n := range w.sizes {
		total += n
		if n > 100 {
			t.Fatalf("a write of %d bytes: more than one element", n)
		}
	}
	if total < 1000*30 {
		t.Fatalf("%d bytes written for 1000 rows", total)
	}
}
