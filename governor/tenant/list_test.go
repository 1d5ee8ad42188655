package tenant

import (
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// twoListeners is an ingress and an egress cap on one counter, the
// ingress's with an override for acme.
func twoListeners(clk clock.Clock) []*Caps {
	m := window.NewMemory(clk)
	return []*Caps{
		New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1000, Window: 60, MaxKeys: 100_000},
			map[string]policy.Limit{"acme": {Rate: 5000, Window: 60}}, m, nil),
		New("egress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1000, Window: 60, MaxKeys: 100_000}, nil, m, nil),
	}
}

// Following the cursors from the top lists every live window exactly
// once, busiest first, ties by listener then tenant, each page at most its
// limit, the last one without a cursor.
func TestListPagesWithCursor(t *testing.T) {
	clk := clock.NewFake(t0)
	caps := twoListeners(clk)
	for i := range 130 {
		for range i % 7 { // counts 0..6: many ties
			caps[i%2].Check([]byte("t"+strconv.Itoa(i)), clk.Now())
		}
	}
	for range 9 {
		caps[0].Check([]byte("acme"), clk.Now())
	}
	all, next := List(caps, MaxListLimit, nil, clk.Now())
	if next != nil || len(all) != 111+1 { // the 111 with i%7 > 0, and acme
		t.Fatalf("whole listing: %d rows, next %v", len(all), next)
	}
	if !slices.IsSortedFunc(all, func(a, b Usage) int { return compare(cursorOf(a), cursorOf(b)) }) || all[0].Tenant != "acme" {
		t.Fatalf("listing out of order: %+v", all[:3])
	}
	for _, limit := range []int{1, 7, 50, len(all), len(all) + 1} {
		var got []Usage
		var after *Cursor
		for pages := 0; ; pages++ {
			if pages > len(all) {
				t.Fatalf("limit %d: no end to the pages", limit)
			}
			// Through the cursor's text, as a client gets it.
			if after != nil {
				c, err := ParseCursor(after.String())
				if err != nil || c != *after {
					t.Fatalf("cursor %+v came back as %+v, %v", *after, c, err)
				}
			}
			page, next := List(caps, limit, after, clk.Now())
			if len(page) > limit || (next != nil && len(page) != limit) {
				t.Fatalf("limit %d: page of %d, next %v", limit, len(page), next)
			}
			got = append(got, page...)
			if next == nil {
				break
			}
			after = next
		}
		if !slices.Equal(got, all) {
			t.Fatalf("limit %d: pages gave %d rows, the listing %d", limit, len(got), len(all))
		}
	}
}

func TestFind(t *testing.T) {
	clk := clock.NewFake(t0)
	caps := twoListeners(clk)
	caps[0].Check([]byte("globex"), clk.Now())
	caps[1].Check([]byte("globex"), clk.Now())
	caps[1].Check([]byte("globex"), clk.Now())
	caps[0].Check([]byte("acme"), clk.Now())
	caps[1].Check(nil, clk.Now())
	tests := []struct {
		tenant string
		want   []Usage
	}{
		{"globex", []Usage{
			{Listener: "ingress", Tenant: "globex", Limit: 1000, Window: 60, Count: 1, Remaining: 999, ExpiresInSeconds: 59.7},
			{Listener: "egress", Tenant: "globex", Limit: 1000, Window: 60, Count: 2, Remaining: 998, ExpiresInSeconds: 59.7},
		}},
		{"acme", []Usage{{Listener: "ingress", Tenant: "acme", Limit: 5000, Window: 60, Count: 1, Remaining: 4999, ExpiresInSeconds: 59.7}}},
		{"header:x-tenant-id", []Usage{{Listener: "egress", Tenant: "header:x-tenant-id", Limit: 1000, Window: 60, Count: 1, Remaining: 999, ExpiresInSeconds: 59.7}}},
		{"initech", []Usage{}},
	}
	for _, tc := range tests {
		if got := Find(caps, tc.tenant, clk.Now()); !slices.Equal(got, tc.want) {
			t.Errorf("Find(%q) = %+v, want %+v", tc.tenant, got, tc.want)
		}
	}
}

// Any tenant name survives a cursor, and text that is not a cursor is an
// error, never a place in the listing.
func TestCursorText(t *testing.T) {
	for _, c := range []Cursor{
		{Count: 0, Listener: "ingress", Tenant: ""},
		{Count: 12, Listener: "egress", Tenant: "a:b:c", Overflow: true},
		{Count: 1 << 40, Listener: "ingress", Tenant: "caf\xe9 \x00\n"},
	} {
		if got, err := ParseCursor(c.String()); err != nil || got != c {
			t.Errorf("cursor %+v came back as %+v, %v", c, got, err)
		}
	}
	for _, bad := range []string{"", "!!", "MTI", "MTI6aW5ncmVzczoyOng", "LTE6aW5ncmVzczowOng"} {
		if _, err := ParseCursor(bad); err == nil {
			t.Errorf("ParseCursor(%q) accepted it", bad)
		}
	}
}

// A page costs memory in its limit, not in the number of tenants: listing
// the top 10 of 50,000 allocates about what the top 10 of 500 does.
func TestListAllocatesInTheLimitNotTheTenants(t *testing.T) {
	allocated := func(tenants int) uint64 {
		clk := clock.NewFake(t0)
		caps := twoListeners(clk)
		for i := range tenants {
			caps[0].Check([]byte("tenant-"+strconv.Itoa(i)), clk.Now())
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rows, _ := List(caps, 10, nil, clk.Now())
		runtime.ReadMemStats(&after)
		if len(rows) != 10 {
			t.Fatalf("%d rows", len(rows))
		}
		return after.TotalAlloc - before.TotalAlloc
	}
	small, large := allocated(500), allocated(50_000)
	// Rows of every tenant would be 50,000 × 100 bytes: 5 MB.
	if large > 64<<10 || large > 4*small+16<<10 {
		t.Fatalf("listing 10 of 50,000 tenants allocated %d bytes (10 of 500: %d)", large, small)
	}
	t.Logf("listing 10 rows allocated %d bytes among 500 tenants, %d among 50,000", small, large)
}

// FuzzParseCursor: `?after=` is a client's bytes. A cursor is parsed or
// refused, never half-read: whatever parses prints back to a cursor that
// parses to the same place.
func FuzzParseCursor(f *testing.F) {
	f.Add(Cursor{Count: 7, Listener: "ingress", Tenant: "acme:1"}.String())
	f.Add(Cursor{Count: 0, Listener: "egress", Tenant: "", Overflow: true}.String())
	f.Add("")
	f.Add("!!")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCursor(s)
		if err != nil {
			return
		}
		again, err := ParseCursor(c.String())
		if err != nil || again != c {
			t.Fatalf("%q parsed to %+v, which prints to %q and parses to %+v (%v)", s, c, c.String(), again, err)
		}
	})
}
