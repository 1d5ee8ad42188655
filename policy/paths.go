package policy

import (
	"fmt"
	"regexp"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Paths, positions and reporting: how the decoder remembers where the file
// wrote each value and turns problems into FILE:LINE:COL issues.

// pos is the position of node n.
func (d *decoder) pos(n *yaml.Node) Position {
	return Position{File: d.file, Line: max(n.Line, 1), Column: max(n.Column, 1)}
}

// loc is what the file wrote at one path.
type loc struct {
	key    *yaml.Node // nil for list items
	val    *yaml.Node
	parent string
}

// has reports whether the file wrote a value at path.
func (d *decoder) has(path string) bool { return d.locs[path].val != nil }

// ok reports whether the file wrote a value at path that decoded cleanly, so
// checks that build on it will not repeat an error already reported.
func (d *decoder) ok(path string) bool { return d.has(path) && !d.bad[path] }

// at is where the value at path is, or failing that the nearest enclosing
// thing the file wrote.
func (d *decoder) at(path string) Position {
	for {
		l, ok := d.locs[path]
		if !ok {
			return Position{File: d.file, Line: 1, Column: 1}
		}
		if l.val != nil {
			return d.pos(l.val)
		}
		path = l.parent
	}
}

// keyAt is where the key of path is (for list items: the item), which is
// where a problem with the entry as a whole belongs.
func (d *decoder) keyAt(path string) Position {
	if k := d.locs[path].key; k != nil {
		return d.pos(k)
	}
	return d.at(path)
}

// line is the line of path, for "first at line N" hints.
func (d *decoder) line(path string) int { return d.keyAt(path).Line }

func (d *decoder) record(parent, path string, key, val *yaml.Node) {
	d.locs[path] = loc{key: key, val: val, parent: parent}
}

// addf records an issue (see firstIssues: past the first MaxErrors in
// file order it is only counted).
func (d *decoder) addf(pos Position, format string, args ...any) {
	d.found.add(pos, "", format, args)
}

// pathf records an issue about path (its message starts with the path).
func (d *decoder) pathf(pos Position, path, format string, args ...any) {
	d.found.add(pos, path, format, args)
}

// failf reports a problem with the value at path, positioned at node n.
func (d *decoder) failf(path string, n *yaml.Node, format string, args ...any) {
	d.bad[path] = true
	d.found.add(d.pos(n), path, format, args)
}

// errors returns the issues in file order, without repeats (an aliased
// subtree can produce the same finding twice).
func (d *decoder) errors() Errors { return d.found.errors() }

func prefix(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}

// where names the mapping a key sits in, for unknown/missing-key messages.
func where(path string) string {
	if path == "" {
		return "at top level"
	}
	return "in " + path
}

var simpleKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// child is the path of key under parent: "targets[0].retry", "pools.stripe".
// Keys that are not plain words are quoted so that paths stay unambiguous:
// pools["a.b"].
func child(parent, key string) string {
	if !simpleKey.MatchString(key) {
		return parent + "[" + strconv.Quote(key) + "]"
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func index(parent string, i int) string { return parent + "[" + strconv.Itoa(i) + "]" }

// suggestion is ` (did you mean "retry"?)` for a near-miss name, or "".
// It is a fmt.Stringer, worked out only when its message is formatted:
// issues past the first MaxErrors never are, and the edit distances of a
// file full of unknown keys would cost more than everything else.
type suggestion struct {
	name  string
	known func() []string
}

func (s suggestion) String() string { return suggest(s.name, s.known()) }

// suggest returns ` (did you mean "retry"?)` for a near-miss key.
func suggest(name string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		// The distance is at least the difference in length: most of a
		// long list of names is skipped without computing it.
		if abs(len(name)-len(k)) >= bestDist {
			continue
		}
		if dist := editDistance(name, k); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	if best == "" || bestDist*2 >= max(len(name), 2) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and adjacent transpositions ("retyr") cost one.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	// Three rows, on the stack: the one being filled and the two before
	// it (a transposition looks two back).
	var rows [3][65]int
	prev2, prev, cur := &rows[0], &rows[1], &rows[2]
	for j := range len(b) + 1 {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

func abs(n int) int { return max(n, -n) }
