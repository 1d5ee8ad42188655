package policy

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// tenantOverrides is a policy with n ingress tenant overrides written as
// format (given the tenant's number), from line 7 on.
func tenantOverrides(n int, format string) []byte {
	var b strings.Builder
	b.WriteString("version: 1\ningress:\n  listen: 127.0.0.1:8080\n  worker: http://127.0.0.1:9000\n  tenant: {rate: 10, window: 60}\n  tenants:\n")
	for i := range n {
		fmt.Fprintf(&b, "    "+format+"\n", i)
	}
	return []byte(b.String())
}

// Mistakes of each kind, one per override.
var manyErrors = []struct {
	name, format string
	first        string // the first error, at line 7
}{
	{"bad window", "t%05d: {rate: 1, window: 7}", "many.yaml:7:31: ingress.tenants.t00000.window: 7 is not one of 1, 60, 3600, 86400"},
	{"unknown key", "t%05d: {rate: 1, window: 60, retyr: 1}", `many.yaml:7:35: unknown key "retyr" in ingress.tenants.t00000`},
}

// A file with 10,000 errors lists the first 100 in file order, then
// counts the rest on one line.
func TestParseListsTheFirstHundredErrors(t *testing.T) {
	for _, tc := range manyErrors {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("many.yaml", tenantOverrides(10_000, tc.format))
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("want Errors, got %T %v", err, err)
			}
			if len(errs.Issues) != MaxErrors || errs.More != 9_900 || errs.Len() != 10_000 {
				t.Fatalf("%d listed, %d more; want %d and 9900", len(errs.Issues), errs.More, MaxErrors)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != MaxErrors+1 {
				t.Fatalf("%d lines, want %d", len(lines), MaxErrors+1)
			}
			if lines[0] != tc.first {
				t.Errorf("first line %q, want %q", lines[0], tc.first)
			}
			for i, l := range lines[:MaxErrors] {
				if want := fmt.Sprintf("many.yaml:%d:", 7+i); !strings.HasPrefix(l, want) || !strings.Contains(l, fmt.Sprintf("t%05d", i)) {
					t.Fatalf("line %d = %q, want the error of tenant %d at line %d", i, l, i, 7+i)
				}
			}
			if last := lines[MaxErrors]; last != "... and 9900 more errors" {
				t.Errorf("last line %q", last)
			}
		})
	}
}

// Errors past the first hundred are counted, not formatted or kept: the
// 10,000-error files cost little more than the same file without
// mistakes (which allocates 27 MB; the unknown keys add two YAML nodes
// each). Before the bound they allocated 102 MB (bad window) and 116 MB
// (unknown key).
func TestManyErrorsAllocateLittle(t *testing.T) {
	valid := allocated(t, tenantOverrides(10_000, "t%05d: {rate: 1, window: 60}"))
	for _, tc := range manyErrors {
		t.Run(tc.name, func(t *testing.T) {
			if got := allocated(t, tenantOverrides(10_000, tc.format)); got > valid*3/2 {
				t.Errorf("10,000 errors allocated %d KiB, the valid file %d KiB; want under 1.5 times", got>>10, valid>>10)
			}
		})
	}
}

// allocated is how many bytes Parse (and formatting its error) allocates.
func allocated(t *testing.T, data []byte) uint64 {
	t.Helper()
	return allocatedBy(func() {
		if _, err := Parse("many.yaml", data); err != nil {
			_ = err.Error()
		}
	})
}

// allocatedBy is how many bytes f allocates.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// firstIssues keeps the first MaxErrors in file order whatever order they
// are found in, drops repeats, and counts the others.
func TestFirstIssues(t *testing.T) {
	at := func(line, col int) Position { return Position{File: "f", Line: line, Column: col} }
	type add struct {
		pos Position
		msg string
	}
	var ascending, descending []add
	for i := range MaxErrors + 50 {
		ascending = append(ascending, add{at(i+1, 1), "m"})
		descending = append(descending, add{at(MaxErrors+50-i, 1), "m"})
	}
	cases := []struct {
		name  string
		adds  []add
		first string // String of the first kept
		last  string // String of the last kept
		n     int    // kept
		more  int
	}{
		{"none", nil, "", "", 0, 0},
		{"in file order", ascending, "f:1:1: m", "f:100:1: m", MaxErrors, 50},
		{"found backwards", descending, "f:1:1: m", "f:100:1: m", MaxErrors, 50},
		{"same position keeps finding order", []add{{at(2, 1), "b"}, {at(1, 1), "a"}, {at(2, 1), "c"}}, "f:1:1: a", "f:2:1: c", 3, 0},
		{"repeats dropped", []add{{at(2, 1), "b"}, {at(2, 1), "b"}, {at(1, 5), "a"}, {at(2, 1), "b"}}, "f:1:5: a", "f:2:1: b", 2, 0},
		{"columns order one line", []add{{at(3, 9), "z"}, {at(3, 2), "y"}}, "f:3:2: y", "f:3:9: z", 2, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f firstIssues
			for _, a := range tc.adds {
				f.add(a.pos, "", "%s", []any{a.msg})
			}
			errs := f.errors()
			if len(errs.Issues) != tc.n || errs.More != tc.more {
				t.Fatalf("%d kept, %d more; want %d and %d", len(errs.Issues), errs.More, tc.n, tc.more)
			}
			if tc.n == 0 {
				return
			}
			if got := errs.Issues[0].String(); got != tc.first {
				t.Errorf("first %q, want %q", got, tc.first)
			}
			if got := errs.Issues[tc.n-1].String(); got != tc.last {
				t.Errorf("last %q, want %q", got, tc.last)
			}
			for i := 1; i < tc.n; i++ {
				if before(errs.Issues[i].Pos, errs.Issues[i-1].Pos) {
					t.Fatalf("out of file order at %d: %v", i, errs.Issues)
				}
			}
		})
	}
}

// A message shows at most maxShown bytes of each value: a file can alias
// one long string into every error it lists (a 900 KB string in 150
// timeouts made 135 MB of messages).
func TestLongValuesAreClipped(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\ntargets:\n  - {name: t, hosts: [h], timeout: &a \"" + strings.Repeat("é", 100_000) + "\"}\n")
	for i := range 150 {
		fmt.Fprintf(&b, "  - {name: t%d, hosts: [h%d], timeout: *a}\n", i, i)
	}
	_, err := Parse("t.yaml", []byte(b.String()))
	var errs Errors
	if !errors.As(err, &errs) || errs.Len() != 151 {
		t.Fatalf("want 151 errors, got %.300v", err)
	}
	for _, is := range errs.Issues {
		if len(is.Message) > 2*maxShown || !utf8.ValidString(is.Message) || !strings.Contains(is.Message, `é..." is not a duration`) {
			t.Fatalf("message of %d bytes: %.300s", len(is.Message), is.Message)
		}
	}
}

// Past the cut, an issue is not even formatted: its arguments' String
// methods are never called.
func TestIssuesPastTheCutAreNotFormatted(t *testing.T) {
	var f firstIssues
	for i := range MaxErrors {
		f.add(Position{Line: i + 1, Column: 1}, "", "m", nil)
	}
	called := false
	f.add(Position{Line: MaxErrors + 1, Column: 1}, "p", "%v", []any{stringer(func() string { called = true; return "" })})
	if called || f.more != 1 {
		t.Errorf("formatted: %v, more: %d", called, f.more)
	}
}

type stringer func() string

func (s stringer) String() string { return s() }

// The issue that stops decoding is listed even past the cut, last.
func TestAddListedTakesTheLastPlace(t *testing.T) {
	var f firstIssues
	for i := range MaxErrors + 50 {
		f.add(Position{File: "f", Line: i + 1, Column: 1}, "", "m", nil)
	}
	f.addListed(Position{File: "f", Line: 500, Column: 3}, "targets[9]", "stop", nil)
	errs := f.errors()
	if len(errs.Issues) != MaxErrors || errs.More != 51 {
		t.Fatalf("%d listed, %d more; want %d and 51", len(errs.Issues), errs.More, MaxErrors)
	}
	if got := errs.Issues[MaxErrors-1].String(); got != "f:500:3: targets[9]: stop" {
		t.Errorf("last listed %q", got)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"retry", "retry", 0}, {"", "abc", 3}, {"abc", "", 3},
		{"retyr", "retry", 1}, {"rety", "retry", 1}, {"retrys", "retry", 1}, {"retro", "retry", 1},
		{"ingres", "ingress", 1}, {"windwo", "window", 1}, {"kitten", "sitting", 3},
		{"ca", "abc", 3}, // OSA: no edit after a transposition
		{strings.Repeat("a", 65), "a", 99},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	if got := suggest("retyr", []string{"count", "logic", "retry", "delay"}); got != ` (did you mean "retry"?)` {
		t.Errorf("suggest = %q", got)
	}
}
