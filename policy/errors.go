package policy

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxErrors is how many errors a policy's Errors lists. A file can hold
// hundreds of thousands of mistakes (one per line of a generated tenant
// list); the ones past the first MaxErrors are counted, never kept or
// formatted, so that reporting them costs no more than reporting a
// hundred, in memory, in the log and in /v1/policy.
const MaxErrors = 100

// Issue is one finding about a policy file, located at FILE:LINE:COL.
type Issue struct {
	Pos     Position
	Message string
}

func (i Issue) String() string {
	return fmt.Sprintf("%s:%d:%d: %s", i.Pos.File, i.Pos.Line, i.Pos.Column, i.Message)
}

// Errors is what is wrong with one policy file: its first MaxErrors
// errors in file order, and how many more there are.
type Errors struct {
	Issues []Issue
	More   int // errors found after Issues, counted only
}

// Len is how many errors the file has, listed or not.
func (e Errors) Len() int { return len(e.Issues) + e.More }

// Lines is one line per listed error, FILE:LINE:COL: message, then, when
// some were only counted, "... and N more errors".
func (e Errors) Lines() []string { return lines(e.Issues, e.More, "error") }

func (e Errors) Error() string { return strings.Join(e.Lines(), "\n") }

// WarningLines is one line per listed warning, FILE:LINE:COL: message,
// then, when some were only counted, "... and N more warnings".
func (p *Policy) WarningLines() []string { return lines(p.Warnings, p.MoreWarnings, "warning") }

// lines is one line per issue, then "... and 9900 more errors" (for noun
// "error") when more were counted.
func lines(issues []Issue, more int, noun string) []string {
	out := make([]string, len(issues), len(issues)+1)
	for i, is := range issues {
		out[i] = is.String()
	}
	if more > 0 {
		out = append(out, moreLine(more, noun))
	}
	return out
}

func moreLine(n int, noun string) string {
	if n != 1 {
		noun += "s"
	}
	return "... and " + strconv.Itoa(n) + " more " + noun
}

// firstIssues keeps the first MaxErrors issues in file order while they
// are found in any order (validation reports after decoding), and counts
// the others. An issue is formatted only if it may be kept: one after the
// last kept issue, once MaxErrors are kept, is counted and dropped.
type firstIssues struct {
	kept []Issue // in file order; stable for issues at one position
	more int
}

// oneLine keeps a message on one line, because each issue is one line of
// `warden validate` output.
var oneLine = strings.NewReplacer("\r", `\r`, "\n", `\n`)

// add records the issue at pos whose message is prefix(path) followed by
// format and args; nothing is formatted unless it is kept.
func (f *firstIssues) add(pos Position, path, format string, args []any) {
	if f.counted(pos) {
		return
	}
	full := len(f.kept) == MaxErrors
	msg := prefix(clip(path)) + fmt.Sprintf(format, clipArgs(args)...)
	is := Issue{Pos: pos, Message: oneLine.Replace(msg)}
	// i is where is goes: after every issue at or before its position.
	i := sort.Search(len(f.kept), func(i int) bool { return before(pos, f.kept[i].Pos) })
	// An aliased subtree can produce the same finding twice; a repeat
	// shares its position. An issue whose position is before the last
	// kept one has had every issue at that position kept, so the repeat
	// is found; past the cut they are counted, and stay so.
	for j := i - 1; j >= 0 && !before(f.kept[j].Pos, pos); j-- {
		if f.kept[j] == is {
			return
		}
	}
	if full {
		f.more++
		if i == len(f.kept) {
			return
		}
		f.kept = f.kept[:len(f.kept)-1]
	}
	f.kept = append(f.kept, Issue{})
	copy(f.kept[i+1:], f.kept[i:])
	f.kept[i] = is
}

// counted reports whether an issue at pos falls past the cut, and then
// counts it.
func (f *firstIssues) counted(pos Position) bool {
	if len(f.kept) == MaxErrors && before(f.kept[len(f.kept)-1].Pos, pos) {
		f.more++
		return true
	}
	return false
}

// maxShown bounds what one message shows of each value it quotes, and of
// the path it starts with: a file can alias one long string into every
// error it lists.
const maxShown = 200

// clip is s cut to maxShown bytes (on a character boundary), marked "...".
func clip(s string) string {
	if len(s) <= maxShown {
		return s
	}
	n := maxShown
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// clipArgs is args with each string and error longer than maxShown given
// as clip of its text. (The Stringers messages take, describe and
// suggestion, are short already.)
func clipArgs(args []any) []any {
	var out []any // a copy, once one is clipped
	for i, a := range args {
		var s string
		switch a := a.(type) {
		case string:
			s = a
		case error:
			s = a.Error()
		}
		if len(s) <= maxShown {
			continue
		}
		if out == nil {
			out = slices.Clone(args)
		}
		out[i] = clip(s)
	}
	if out == nil {
		return args
	}
	return out
}

// addListed is add for an issue that must be listed even past the cut:
// then it takes the last listed place, and the issue it displaces is
// counted instead.
func (f *firstIssues) addListed(pos Position, path, format string, args []any) {
	if len(f.kept) == MaxErrors && !before(pos, f.kept[len(f.kept)-1].Pos) {
		f.kept = f.kept[:len(f.kept)-1]
		f.more++
	}
	f.add(pos, path, format, args)
}

// errors is what add found; the zero Errors when nothing.
func (f *firstIssues) errors() Errors {
	if len(f.kept) == 0 {
		return Errors{}
	}
	return Errors{Issues: f.kept, More: f.more}
}

// before reports whether a comes before b in the file.
func before(a, b Position) bool {
	if a.Line != b.Line {
		return a.Line < b.Line
	}
	return a.Column < b.Column
}
