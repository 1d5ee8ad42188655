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
			var d settingDiffs
			d.add("concurrency", a.Concurrency, b.Concurrency)
			d.add("rate", a.Rate, b.Rate)
			d.add("window", int(a.Window), int(b.Window))
			d.add("queue", a.Queue, b.Queue)
			if len(d) == 0 {
				continue
			}
			out = append(out, Issue{Pos: b.Pos, Message: fmt.Sprintf(
				"%s: shares cap_key %q with %s (line %d) but their settings differ (%s); members of a cap_key share one counter and one concurrency limit",
				child("pools", b.Name), b.CapKey, child("pools", a.Name), a.Pos.Line, d)})
		}
		members[b.CapKey] = append(members[b.CapKey], b)
	}
	return out
}

// settingDiffs lists the settings two members of a shared control
// disagree on, as "name x vs y".
type settingDiffs []string

func (d *settingDiffs) add(name string, x, y any) {
	if x != y {
		*d = append(*d, fmt.Sprintf("%s %v vs %v", name, x, y))
	}
}

func (d settingDiffs) String() string { return strings.Join(d, ", ") }
