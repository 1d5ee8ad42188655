package policy

import (
	"fmt"
	"strings"
)

// capKeyWarnings reports pools that share a cap_key but disagree on the
// settings the shared counter and concurrency limit are built from. SPEC §4
// makes this a warning (once per member pair), never an error: the pools
// still share one counter, and only the operator knows which settings were
// meant.
func capKeyWarnings(p *Policy) []Issue {
	var out []Issue
	members := map[string][]Pool{} // cap_key → pools seen so far, in file order
	for _, b := range p.Pools {
		if b.CapKey == "" {
			continue
		}
		for _, a := range members[b.CapKey] {
			var diffs []string
			diff := func(name string, x, y int) {
				if x != y {
					diffs = append(diffs, fmt.Sprintf("%s %d vs %d", name, x, y))
				}
			}
			diff("concurrency", a.Concurrency, b.Concurrency)
			diff("rate", a.Rate, b.Rate)
			diff("window", int(a.Window), int(b.Window))
			diff("queue", a.Queue, b.Queue)
			if len(diffs) == 0 {
				continue
			}
			out = append(out, Issue{Pos: b.Pos, Message: fmt.Sprintf(
				"%s: shares cap_key %q with %s (line %d) but their settings differ (%s); members of a cap_key share one counter and one concurrency limit",
				child("pools", b.Name), b.CapKey, child("pools", a.Name), a.Pos.Line, strings.Join(diffs, ", "))})
		}
		members[b.CapKey] = append(members[b.CapKey], b)
	}
	return out
}
