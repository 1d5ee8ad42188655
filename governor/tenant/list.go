package tenant

import (
	"cmp"
	"container/heap"
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Page sizes of GET /v1/tenants (SPEC §12).
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// Cursor is where a listing page ended: its last row's place in the
// listing order. Pages are cut from the live windows each time, so a
// tenant whose count changes between two pages may show on both or on
// neither.
type Cursor struct {
	Count    int64
	Listener string
	Tenant   string
	Overflow bool
}

func cursorOf(u Usage) Cursor {
	return Cursor{Count: u.Count, Listener: u.Listener, Tenant: u.Tenant, Overflow: u.Overflow}
}

// compare orders a listing: the busiest first, then by listener, then by
// tenant, a tenant's own window before an overflow window of that name.
func compare(a, b Cursor) int {
	if c := cmp.Compare(b.Count, a.Count); c != 0 {
		return c
	}
	if c := strings.Compare(a.Listener, b.Listener); c != 0 {
		return c
	}
	if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
		return c
	}
	switch {
	case a.Overflow == b.Overflow:
		return 0
	case b.Overflow:
		return -1
	}
	return 1
}

// String encodes the cursor for a URL: opaque to clients, and any tenant
// name (the header's bytes) survives it.
func (c Cursor) String() string {
	o := "0"
	if c.Overflow {
		o = "1"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.Count, 10) + ":" + c.Listener + ":" + o + ":" + c.Tenant))
}

var errCursor = errors.New("after must be the cursor a previous page's Link header gave")

// ParseCursor decodes a cursor String made.
func ParseCursor(s string) (Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, errCursor
	}
	parts := strings.SplitN(string(b), ":", 4)
	if len(parts) != 4 || (parts[2] != "0" && parts[2] != "1") {
		return Cursor{}, errCursor
	}
	n, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || n < 0 {
		return Cursor{}, errCursor
	}
	return Cursor{Count: n, Listener: parts[1], Tenant: parts[3], Overflow: parts[2] == "1"}, nil
}

// List returns a page of the live tenant windows of every listener's caps
// (nil caps are skipped): at most limit rows in listing order, those after
// the cursor after (nil: from the top), and the cursor of its last row when
// more follow (nil when this is the last page). It keeps limit+1 rows
// whatever the number of tenants: the windows are read one at a time into
// a bounded heap.
func List(caps []*Caps, limit int, after *Cursor, now time.Time) ([]Usage, *Cursor) {
	h := &worstFirst{}
	for _, c := range caps {
		if c == nil {
			continue
		}
		for u := range c.Usage(now) {
			if after != nil && compare(cursorOf(u), *after) <= 0 {
				continue
			}
			if h.Len() <= limit {
				heap.Push(h, u)
			} else if compare(cursorOf(u), cursorOf((*h)[0])) < 0 {
				(*h)[0] = u
				heap.Fix(h, 0)
			}
		}
	}
	rows := []Usage(*h)
	slices.SortFunc(rows, func(a, b Usage) int { return compare(cursorOf(a), cursorOf(b)) })
	// A shared backend's listing may yield a window twice (SSCAN); the
	// busier copy comes first and stays.
	seen := make(map[Cursor]bool, len(rows))
	rows = slices.DeleteFunc(rows, func(u Usage) bool {
		id := Cursor{Listener: u.Listener, Tenant: u.Tenant, Overflow: u.Overflow}
		dup := seen[id]
		seen[id] = true
		return dup
	})
	if len(rows) <= limit {
		return rows, nil
	}
	rows = rows[:limit]
	next := cursorOf(rows[limit-1])
	return rows, &next
}

// Find returns tenant's window on each listener that has one.
func Find(caps []*Caps, tenant string, now time.Time) []Usage {
	out := []Usage{}
	for _, c := range caps {
		if c == nil {
			continue
		}
		if u, ok := c.Lookup(tenant, now); ok {
			out = append(out, u)
		}
	}
	return out
}

// worstFirst is a heap whose top is the row latest in listing order: the
// one to drop when a better row comes.
type worstFirst []Usage

func (h worstFirst) Len() int           { return len(h) }
func (h worstFirst) Less(i, j int) bool { return compare(cursorOf(h[i]), cursorOf(h[j])) > 0 }
func (h worstFirst) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *worstFirst) Push(x any)        { *h = append(*h, x.(Usage)) }
func (h *worstFirst) Pop() any {
	old := *h
	u := old[len(old)-1]
	*h = old[:len(old)-1]
	return u
}
