package policy

import (
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
		{"one warning per pair", `version: 1
pools:
  a: {queue: 1, cap_key: k}
  b: {queue: 2, cap_key: k}
  c: {queue: 2, cap_key: k}
`, []string{
			`4:3: pools.b: shares cap_key "k" with pools.a (line 3) but their settings differ (queue 1 vs 2)`,
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
