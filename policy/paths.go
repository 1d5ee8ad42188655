package policy

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Paths, positions and reporting: how the decoder remembers where the file
// wrote each value and turns problems into FILE:LINE:COL issues.

// pos is the position of node n.
func (d *decoder) pos(n *yaml.Node) Position {
	return Position{File: d.file, Line: max(n.Line, 1), Column: max(n.Column, 1)}
}

// loc is what the file wrote at one path. It keeps positions, not nodes,
// so that each part of the YAML tree can go once decoded (see release).
type loc struct {
	key, val spot // key is zero for list items; val for a path only marked bad
	bad      bool // the value was reported as wrong
}

// spot is a position in the file; zero for none.
type spot struct{ line, col int32 }

func (d *decoder) spot(n *yaml.Node) spot {
	p := d.pos(n)
	return spot{int32(p.Line), int32(p.Column)}
}

func (d *decoder) position(s spot) Position {
	return Position{File: d.file, Line: int(s.line), Column: int(s.col)}
}

// has reports whether the file wrote a value at path.
func (d *decoder) has(path string) bool { return d.locs[path].val != spot{} }

// ok reports whether the file wrote a value at path that decoded cleanly, so
// checks that build on it will not repeat an error already reported.
func (d *decoder) ok(path string) bool {
	l := d.locs[path]
	return l.val != spot{} && !l.bad
}

// written is has(strings.Join(parts, "")) without building the path,
// for the lookups made once per target or bridge.
func (d *decoder) written(parts ...string) bool { return d.joined(parts).val != spot{} }

// okAt is ok(prefix + suffix) without building the path.
func (d *decoder) okAt(prefix, suffix string) bool {
	l := d.joined([]string{prefix, suffix})
	return l.val != spot{} && !l.bad
}

// okItem is ok(index(list, i)) without building the path.
func (d *decoder) okItem(list string, i int) bool {
	d.scratch = append(append(d.scratch[:0], list...), '[')
	d.scratch = append(strconv.AppendInt(d.scratch, int64(i), 10), ']')
	l := d.locs[string(d.scratch)]
	return l.val != spot{} && !l.bad
}

func (d *decoder) joined(parts []string) loc {
	d.scratch = d.scratch[:0]
	for _, p := range parts {
		d.scratch = append(d.scratch, p...)
	}
	return d.locs[string(d.scratch)]
}

// isBad reports whether the value at path was reported as wrong.
func (d *decoder) isBad(path string) bool { return d.locs[path].bad }

// markBad records that the value at path was reported as wrong. The path
// is almost always one the file wrote, whose loc it updates in place.
func (d *decoder) markBad(path string) {
	l := d.locs[path]
	l.bad = true
	d.locs[path] = l
}

// at is where the value at path is; 1:1 for a path the file did not
// write (problems are reported at paths it wrote).
func (d *decoder) at(path string) Position {
	if l := d.locs[path]; l.val != (spot{}) {
		return d.position(l.val)
	}
	return Position{File: d.file, Line: 1, Column: 1}
}

// keyAt is where the key of path is (for list items: the item), which is
// where a problem with the entry as a whole belongs.
func (d *decoder) keyAt(path string) Position {
	if k := d.locs[path].key; k != (spot{}) {
		return d.position(k)
	}
	return d.at(path)
}

// line is the line of path, for "first at line N" hints.
func (d *decoder) line(path string) int { return d.keyAt(path).Line }

// record notes that the file wrote val (under key, for a mapping entry)
// at path.
func (d *decoder) record(path string, key, val *yaml.Node) {
	l := loc{val: d.spot(val), bad: d.locs[path].bad}
	if key != nil {
		l.key = d.spot(key)
	}
	d.locs[path] = l
}

// item is the path of the i-th element of the decoded list at path: its
// index in the file, which differs when the decoder left out elements
// that were not mappings (see list).
func (d *decoder) item(path string, i int) string {
	if ix, ok := d.fileIndex[path]; ok {
		i = ix[i]
	}
	return index(path, i)
}

// addf records an issue (see firstIssues: past the first MaxErrors in
// file order it is only counted).
func (d *decoder) addf(pos Position, format string, args ...any) {
	d.found.add(pos, "", format, args)
}

// listed reports whether an issue at pos would be listed; if not, it
// counts it, and the caller need not build its message.
func (d *decoder) listed(pos Position) bool { return !d.found.counted(pos) }

// pathf records an issue about path (its message starts with the path).
func (d *decoder) pathf(pos Position, path, format string, args ...any) {
	d.found.add(pos, path, format, args)
}

// failf reports a problem with the value at path, positioned at node n.
func (d *decoder) failf(path string, n *yaml.Node, format string, args ...any) {
	d.markBad(path)
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

// child is the path of key under parent: "targets[0].retry", "pools.stripe".
// Keys that are not plain words are quoted so that paths stay unambiguous:
// pools["a.b"].
func child(parent, key string) string {
	if !simpleKey(key) {
		return parent + "[" + strconv.Quote(key) + "]"
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// simpleKey reports whether key is a plain word: [A-Za-z0-9_-]+.
func simpleKey(key string) bool {
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return key != ""
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
