package retry

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{"99999999999999999999999", MaxRetryAfter, true},
		{"12s", 0, false},
		{"-5", 0, false},
		{" 5", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Mon, 02 Mar 2026 10:00", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzRetryAfter: any header value parses without a panic to a wait in
// [0, MaxRetryAfter], and whole seconds read back as written.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "120", "99999999999999999999999", "Mon, 02 Mar 2026 10:01:30 GMT", "Monday, 02-Mar-26 10:01:30 GMT", "soon"} {
		f.Add(s)
	}
	now := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if d < 0 || d > MaxRetryAfter || (!ok && d != 0) {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v", v, d, ok)
		}
		if n, err := strconv.ParseUint(v, 10, 64); err == nil && n <= uint64(MaxRetryAfter/time.Second) {
			if !ok || d != time.Duration(n)*time.Second {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want %d s", v, d, ok, n)
			}
		}
	})
}
