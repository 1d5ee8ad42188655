package main

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// row is one scenario's line of the table. Counts that do not apply to a
// scenario stay at na and show as "-".
type row struct {
	scenario, load, fault string
	checks                []check
	lostRequests          int
	lostRuns              int
	duplicates            int
	maxConc, capConc      int
	clientErrors          int
	errorsNote            string // what the client errors were, when expected
	recovery              time.Duration
	before, peak, after   usage
	sampled               bool
	notes                 []string
	setup                 error // the scenario could not run
}

const na = -1

func newRow(name string) *row {
	return &row{scenario: name, lostRequests: na, lostRuns: na, duplicates: na,
		maxConc: na, capConc: na, clientErrors: na, recovery: na}
}

// check is one invariant checked, with what was seen.
type check struct {
	name   string
	ok     bool
	detail string
}

// check records an invariant: its name, whether it held, and what was
// seen, whichever way it went.
func (r *row) check(name string, ok bool, format string, args ...any) {
	// Bodies quoted in a detail may span lines; the table keeps one a check.
	detail := strings.Join(strings.Fields(fmt.Sprintf(format, args...)), " ")
	r.checks = append(r.checks, check{name: name, ok: ok, detail: detail})
}

func (r *row) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func (r *row) passed() bool {
	if r.setup != nil || len(r.checks) == 0 {
		return false
	}
	for _, c := range r.checks {
		if !c.ok {
			return false
		}
	}
	return true
}

func (r *row) verdict() string {
	if r.setup != nil {
		return "ERROR: " + r.setup.Error()
	}
	var failed []string
	for _, c := range r.checks {
		if !c.ok {
			failed = append(failed, c.name)
		}
	}
	if len(failed) > 0 {
		return "FAIL: " + strings.Join(failed, ", ")
	}
	if len(r.checks) == 0 {
		return "ERROR: no invariant checked"
	}
	return "PASS"
}

// mb shows bytes in decimal megabytes, as the table's RSS column does.
func mb[T int64 | float64](bytes T) string { return fmt.Sprintf("%.0f MB", float64(bytes)/1e6) }

func count(n int) string {
	if n == na {
		return "-"
	}
	return fmt.Sprint(n)
}

func (r *row) concCell() string {
	if r.maxConc == na {
		return "-"
	}
	return fmt.Sprintf("%d/%d", r.maxConc, r.capConc)
}

func (r *row) errorsCell() string {
	if r.clientErrors == na {
		return "-"
	}
	if r.errorsNote != "" {
		return fmt.Sprintf("%d (%s)", r.clientErrors, r.errorsNote)
	}
	return fmt.Sprint(r.clientErrors)
}

func (r *row) recoveryCell() string {
	if r.recovery == na {
		return "-"
	}
	return r.recovery.Round(time.Millisecond).String()
}

// triple shows a figure before, at its peak and after.
func (r *row) triple(f func(usage) float64, unit string) string {
	if !r.sampled {
		return "-"
	}
	v := func(u usage) string {
		x := f(u)
		if x < 0 {
			return "?"
		}
		return fmt.Sprintf("%.0f", x)
	}
	return v(r.before) + "/" + v(r.peak) + "/" + v(r.after) + unit
}

func (r *row) invariants() string {
	names := make([]string, len(r.checks))
	for i, c := range r.checks {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// render is the table, then each invariant with what was seen, then notes.
func render(rows []*row, mode string) string {
	header := []string{"scenario", "load offered", "fault injected", "invariants checked", "req lost", "runs lost", "dup",
		"conc/cap", "client errors", "recovery", "RSS MB b/p/a", "fds b/p/a", "goroutines b/p/a", "result"}
	cells := [][]string{header}
	for _, r := range rows {
		cells = append(cells, []string{r.scenario, r.load, r.fault, r.invariants(), count(r.lostRequests), count(r.lostRuns),
			count(r.duplicates), r.concCell(), r.errorsCell(), r.recoveryCell(),
			r.triple(func(u usage) float64 {
				if u.rss < 0 {
					return -1
				}
				return float64(u.rss) / 1e6
			}, ""),
			r.triple(func(u usage) float64 { return float64(u.fds) }, ""),
			r.triple(func(u usage) float64 { return float64(u.goroutines) }, ""),
			r.verdict()})
	}
	// Long cells wrap onto more lines of their row, so that the table
	// stays readable in a terminal.
	wrapped := make([][][]string, len(cells)) // row, column, lines
	width := make([]int, len(header))
	for i, row := range cells {
		wrapped[i] = make([][]string, len(row))
		for j, c := range row {
			wrapped[i][j] = wrap(c, cellWidth)
			for _, l := range wrapped[i][j] {
				width[j] = max(width[j], len([]rune(l)))
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "make chaos (%s mode), %d CPUs, %s\n\n", mode, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	rule := func(cross string) {
		for j := range header {
			if j > 0 {
				b.WriteString(cross)
			}
			b.WriteString(strings.Repeat("-", width[j]))
		}
		b.WriteString("\n")
	}
	var line strings.Builder
	for _, row := range wrapped {
		height := 0
		for _, lines := range row {
			height = max(height, len(lines))
		}
		for k := range height {
			for j, lines := range row {
				if j > 0 {
					line.WriteString(" | ")
				}
				l := ""
				if k < len(lines) {
					l = lines[k]
				}
				line.WriteString(l + strings.Repeat(" ", width[j]-len([]rune(l))))
			}
			b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
			line.Reset()
		}
		rule("-+-")
	}
	b.WriteString("\ninvariants (what was seen):\n")
	failed := 0
	for _, r := range rows {
		if r.setup != nil {
			fmt.Fprintf(&b, "  %-17s ERROR  could not run: %v\n", r.scenario, r.setup)
			failed++
		}
		for _, c := range r.checks {
			mark := "ok  "
			if !c.ok {
				mark = "FAIL"
				failed++
			}
			fmt.Fprintf(&b, "  %-17s %s  %s: %s\n", r.scenario, mark, c.name, c.detail)
		}
		for _, n := range r.notes {
			fmt.Fprintf(&b, "  %-17s note  %s\n", r.scenario, n)
		}
	}
	if failed == 0 {
		b.WriteString("\nall invariants held\n")
	} else {
		fmt.Fprintf(&b, "\n%d invariant(s) FAILED:", failed)
		for _, r := range rows {
			if r.setup != nil {
				fmt.Fprintf(&b, " %s/setup", r.scenario)
			}
			for _, c := range r.checks {
				if !c.ok {
					fmt.Fprintf(&b, " %s/%s", r.scenario, c.name)
				}
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// cellWidth is where a table cell wraps.
const cellWidth = 32

// wrap breaks s into lines of at most n runes at spaces (a longer word
// stands alone on its line).
func wrap(s string, n int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len([]rune(line))+1+len([]rune(w)) <= n:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	if line != "" || len(lines) == 0 {
		lines = append(lines, line)
	}
	return lines
}
