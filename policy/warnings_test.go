package policy

import (
	"fmt"
	"strings"
	"testing"
)

func TestCapKeyWarnings(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string // "LINE:COL: fragment", one per member pair
	}{
		{"settings agree", `version: 1
pools:
  a: {concurrency: 5, rate: 100, window: 60, queue: 10, cap_key: k}
  b: {concurrency: 5, rate: 100, window: 60, queue: 10, cap_key: k, max_wait: 1s}
`, nil},
		{"different keys never compared", `version: 1
pools:
  a: {concurrency: 5, cap_key: k1}
  b: {concurrency: 6, cap_key: k2}
  c: {concurrency: 7}
`, nil},
		{"one pair differs", `version: 1
pools:
  a: {concurrency: 5, rate: 100, window: 60, cap_key: k}
  b: {concurrency: 6, rate: 100, window: 1, cap_key: k}
`, []string{`4:3: pools.b: shares cap_key "k" with pools.a (line 3) but their settings differ (concurrency 5 vs 6, window 60 vs 1)`}},
		{"each member against the first", `version: 1
pools:
  a: {queue: 1, cap_key: k}
  b: {queue: 2, cap_key: k}
  c: {queue: 2, cap_key: k}
`, []string{
			`4:3: pools.b: shares cap_key "k" with pools.a (line 3) but their settings differ (queue 1 vs 2)`,
			`5:3: pools.c: shares cap_key "k" with pools.a (line 3) but their settings differ (queue 1 vs 2)`,
		}},
		{"members agreeing with the first are not compared with each other", `version: 1
pools:
  a: {queue: 1, cap_key: k}
  b: {queue: 1, cap_key: k}
  c: {queue: 2, cap_key: k}
`, []string{
			`5:3: pools.c: shares cap_key "k" with pools.a (line 3) but their settings differ (queue 1 vs 2)`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("t.yaml", []byte(tc.src))
			if err != nil {
				t.Fatalf("a cap_key mismatch must never be an error: %v", err)
			}
			if len(p.Warnings) != len(tc.want) {
				t.Fatalf("got %d warnings, want %d: %v", len(p.Warnings), len(tc.want), p.Warnings)
			}
			for i, w := range tc.want {
				if got := p.Warnings[i].String(); !strings.HasPrefix(got, "t.yaml:"+w) {
					t.Errorf("warning %d = %q, want prefix %q", i, got, "t.yaml:"+w)
				}
			}
		})
	}
}

// A cap_key of 3,000 members, every other one different, gives one warning
// per differing member (once per pair it was 2.25 million, a gigabyte for
// a 113 KB file), and only the first hundred are listed.
func TestCapKeyWarningsAreBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\npools:\n")
	for i := range 3000 {
		fmt.Fprintf(&b, "  p%d: {concurrency: %d, cap_key: k}\n", i, 1+i%2)
	}
	p, err := Parse("t.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != MaxErrors || p.MoreWarnings != 1500-MaxErrors {
		t.Fatalf("%d warnings listed, %d more; want %d and %d", len(p.Warnings), p.MoreWarnings, MaxErrors, 1500-MaxErrors)
	}
	if got, want := p.Warnings[0].String(), `t.yaml:4:3: pools.p1: shares cap_key "k" with pools.p0 (line 3)`; !strings.HasPrefix(got, want) {
		t.Errorf("first warning %q, want prefix %q", got, want)
	}
}

// An admin listener other hosts can reach, with no token configured,
// gets a warning: its GETs are unauthenticated. Loopback, or a token in
// the environment, does not.
func TestAdminListenerWarning(t *testing.T) {
	const env = "WARDEN_TEST_ADMIN_TOKEN"
	cases := []struct {
		listen, token string
		warn          bool
	}{
		{"0.0.0.0:9901", "", true},
		{":9901", "", true},
		{"[::]:9901", "", true},
		{"10.1.2.3:9901", "", true},
		{"admin.internal:9901", "", true},
		{"0.0.0.0:9901", " \n", true}, // blank is no token
		{"0.0.0.0:9901", "s3cret", false},
		{"127.0.0.1:9901", "", false},
		{"127.0.0.2:9901", "", false},
		{"[::1]:9901", "", false},
		{"localhost:9901", "", false},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s token %q", tc.listen, tc.token), func(t *testing.T) {
			t.Setenv(env, tc.token)
			p, err := Parse("t.yaml", []byte(fmt.Sprintf("version: 1\nadmin: {listen: %q, token_env: %s}\n", tc.listen, env)))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.warn {
				if len(p.Warnings) != 0 {
					t.Fatalf("unexpected warning: %v", p.Warnings)
				}
				return
			}
			if len(p.Warnings) != 1 {
				t.Fatalf("got %d warnings, want 1: %v", len(p.Warnings), p.Warnings)
			}
			got := p.Warnings[0].String()
			for _, want := range []string{"t.yaml:2:17: admin.listen: " + tc.listen + " is not a loopback address", env + " is unset or blank", "every admin GET (tenants, queues, metrics, policy)", "unauthenticated"} {
				if !strings.Contains(got, want) {
					t.Errorf("warning %q lacks %q", got, want)
				}
			}
		})
	}
}
