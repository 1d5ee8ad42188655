package policy

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

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

// addf records an issue. Messages are kept to one line, because each issue
// is one line of `warden validate` output.
func (d *decoder) addf(pos Position, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	msg = strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(msg)
	d.issues = append(d.issues, Issue{Pos: pos, Message: msg})
}

// failf reports a problem with the value at path, positioned at node n.
func (d *decoder) failf(path string, n *yaml.Node, format string, args ...any) {
	d.bad[path] = true
	d.addf(d.pos(n), prefix(path)+format, args...)
}

// errors returns the issues sorted into file order, without repeats (an
// aliased subtree can produce the same finding twice).
func (d *decoder) errors() Errors {
	if len(d.issues) == 0 {
		return nil
	}
	sort.SliceStable(d.issues, func(i, j int) bool {
		a, b := d.issues[i].Pos, d.issues[j].Pos
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	out := make(Errors, 0, len(d.issues))
	seen := map[Issue]bool{}
	for _, is := range d.issues {
		if !seen[is] {
			seen[is] = true
			out = append(out, is)
		}
	}
	return out
}

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

// suggest returns ` (did you mean "retry"?)` for a near-miss key.
func suggest(name string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
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
	m := make([][]int, len(a)+1)
	for i := range m {
		m[i] = make([]int, len(b)+1)
		m[i][0] = i
	}
	for j := range m[0] {
		m[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			m[i][j] = min(m[i-1][j]+1, m[i][j-1]+1, m[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				m[i][j] = min(m[i][j], m[i-2][j-2]+1)
			}
		}
	}
	return m[len(a)][len(b)]
}
