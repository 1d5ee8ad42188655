package window

import (
	"testing"
	"time"

	"github.com/warden-dev/warden/policy"
)

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load location %s: %v", name, err)
	}
	return loc
}

func TestBounds(t *testing.T) {
	utc := time.UTC
	kol := mustLoc(t, "Asia/Kolkata")
	ny := mustLoc(t, "America/New_York")
	tests := []struct {
		name       string
		at         time.Time
		w          policy.Window
		start, end time.Time
	}{
		{"utc second", time.Date(2026, 1, 5, 12, 0, 17, 500e6, utc), 1,
			time.Date(2026, 1, 5, 12, 0, 17, 0, utc), time.Date(2026, 1, 5, 12, 0, 18, 0, utc)},
		{"utc minute seed 002 example", time.Date(2026, 1, 5, 12, 0, 17, 0, utc), 60,
			time.Date(2026, 1, 5, 12, 0, 0, 0, utc), time.Date(2026, 1, 5, 12, 1, 0, 0, utc)},
		{"utc minute exactly on boundary", time.Date(2026, 1, 5, 12, 1, 0, 0, utc), 60,
			time.Date(2026, 1, 5, 12, 1, 0, 0, utc), time.Date(2026, 1, 5, 12, 2, 0, 0, utc)},
		{"utc hour", time.Date(2026, 1, 5, 12, 59, 59, 999, utc), 3600,
			time.Date(2026, 1, 5, 12, 0, 0, 0, utc), time.Date(2026, 1, 5, 13, 0, 0, 0, utc)},
		{"utc day", time.Date(2026, 1, 5, 23, 59, 59, 0, utc), 86400,
			time.Date(2026, 1, 5, 0, 0, 0, 0, utc), time.Date(2026, 1, 6, 0, 0, 0, 0, utc)},
		// +05:30: the local hour starts at :30 UTC, which UTC truncation gets wrong.
		{"kolkata hour", time.Date(2026, 1, 5, 12, 10, 0, 0, kol), 3600,
			time.Date(2026, 1, 5, 12, 0, 0, 0, kol), time.Date(2026, 1, 5, 13, 0, 0, 0, kol)},
		{"kolkata minute", time.Date(2026, 1, 5, 12, 10, 42, 0, kol), 60,
			time.Date(2026, 1, 5, 12, 10, 0, 0, kol), time.Date(2026, 1, 5, 12, 11, 0, 0, kol)},
		{"kolkata day is local midnight", time.Date(2026, 1, 5, 3, 0, 0, 0, kol), 86400,
			time.Date(2026, 1, 5, 0, 0, 0, 0, kol), time.Date(2026, 1, 6, 0, 0, 0, 0, kol)},
		// America/New_York springs forward on 2026-03-08 at 02:00 and falls back on 2026-11-01 at 02:00.
		{"new york spring-forward day", time.Date(2026, 3, 8, 12, 0, 0, 0, ny), 86400,
			time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{"new york fall-back day", time.Date(2026, 11, 1, 12, 0, 0, 0, ny), 86400,
			time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 11, 2, 0, 0, 0, 0, ny)},
		{"new york hour before spring forward ends at the jump", time.Date(2026, 3, 8, 1, 30, 0, 0, ny), 3600,
			time.Date(2026, 3, 8, 1, 0, 0, 0, ny), time.Date(2026, 3, 8, 3, 0, 0, 0, ny)},
		{"new york first 01:30 of fall back ends at the repeat of 01:00",
			time.Date(2026, 11, 1, 5, 30, 0, 0, utc).In(ny), 3600,
			time.Date(2026, 11, 1, 5, 0, 0, 0, utc), time.Date(2026, 11, 1, 6, 0, 0, 0, utc)},
		{"new york second 01:30 of fall back",
			time.Date(2026, 11, 1, 6, 30, 0, 0, utc).In(ny), 3600,
			time.Date(2026, 11, 1, 6, 0, 0, 0, utc), time.Date(2026, 11, 1, 7, 0, 0, 0, utc)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, e := Bounds(tc.at, tc.w)
			if !s.Equal(tc.start) || !e.Equal(tc.end) {
				t.Fatalf("Bounds(%v, %d) = [%v, %v), want [%v, %v)", tc.at, tc.w, s, e, tc.start, tc.end)
			}
		})
	}
}

func TestDayWindowLengthAcrossDST(t *testing.T) {
	ny := mustLoc(t, "America/New_York")
	tests := []struct {
		day  time.Time
		want time.Duration
	}{
		{time.Date(2026, 3, 8, 10, 0, 0, 0, ny), 23 * time.Hour},
		{time.Date(2026, 11, 1, 10, 0, 0, 0, ny), 25 * time.Hour},
		{time.Date(2026, 6, 1, 10, 0, 0, 0, ny), 24 * time.Hour},
	}
	for _, tc := range tests {
		s, e := Bounds(tc.day, policy.WindowDay)
		if got := e.Sub(s); got != tc.want {
			t.Errorf("day of %v lasts %v, want %v", tc.day, got, tc.want)
		}
	}
}

// Every instant belongs to exactly one window and consecutive windows tile
// time with no gap, whatever the zone does.
func TestBoundsTileTime(t *testing.T) {
	for _, name := range []string{"UTC", "Asia/Kolkata", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"} {
		loc := mustLoc(t, name)
		for _, w := range []policy.Window{1, 60, 3600, 86400} {
			at := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
			limit := at.AddDate(1, 0, 0)
			if w < 3600 {
				limit = at.Add(3 * 24 * time.Hour)
			}
			_, end := Bounds(at, w)
			for at.Before(limit) {
				s, e := Bounds(end, w)
				if !s.Equal(end) {
					t.Fatalf("%s w=%d: window after %v starts at %v", name, w, end, s)
				}
				if !e.After(s) {
					t.Fatalf("%s w=%d: empty window [%v,%v)", name, w, s, e)
				}
				at, end = e, e
			}
		}
	}
}
