package policy

import (
	"unicode/utf16"
	"unicode/utf8"
)

// maxNodes bounds the YAML nodes (keys, values, lists, mappings) a policy
// file may hold. yaml.v3 builds its whole node tree, some 165 bytes a node
// and 230 allocated, before the decoder sees any of it, and its smallest
// nodes take two bytes of the file ("0,"), so a file of maxFileSize can ask
// for half a million of them. Parse refuses a file whose nodeBound is above
// maxNodes without parsing it. 1 MiB of ordinary policy is well below: the
// densest, tenant overrides written `    t000001: { rate: 500, window: 1 }`
// (6 nodes in 38 bytes), bounds to 165,566. At the bound the tree is
// about 41 MB.
const maxNodes = 250_000

// nodeBound is an upper bound of the nodes yaml.v3 builds when it parses
// data, found in one pass over the bytes without parsing. It counts the
// bytes that can make nodes and over-counts where they stand for something
// else (inside quoted strings, comments, URLs): exact on tenant overrides
// and lists of scalars, at most 5 times over on lists of empty lists.
//
// Why it is a bound: every node yaml.v3 builds is charged below to a byte
// the pass counts (or to the constant), no byte more times than it is
// counted, and a byte counted only in some places is charged only there.
//
//   - A flow list or mapping: its '[' or '{'. An alias: its '*'. A quoted
//     scalar: its opening quote, which stands where a token may start.
//     A block scalar: its '|' or '>', after a blank. A node holding only
//     an anchor or a tag: its '&' or '!'.
//   - A plain scalar: the first line break after its last character, when
//     its scan goes past one; else the byte that ends it: a ':' before a
//     blank, a '#' after one, a flow indicator (',' '[' ']' '{' '}' '?'),
//     or the end of the file. No two scalars end at one byte. A '[', '{'
//     or '?' that ends one is in a flow collection that wants a ',' there,
//     so yaml.v3 fails before building what that byte would start.
//   - A block list: its first '-', which a blank follows. A block mapping:
//     the line break before its first key, when that key starts its line
//     (the constant, for the first line), else the '-', '?' or ':' just
//     before it on the line (`- a: 1`, `? a: 1`, `: b: c` after `? a`;
//     yaml.v3 refuses `a: b: c`). Such a line break has no plain scalar
//     or empty value before it: the line before a deeper mapping ends with
//     what introduces it (':', '-', '?', an anchor or tag, or a comment).
//   - An empty value (`a:`, `-`, `? a`) after a ':' or '-' in block
//     context: the line break (or end of file) ending the line that ':' or
//     '-' is then the last thing on; after ':' in a flow collection: the
//     ',', ']' or '}' that follows. An empty document: its "---". Around a
//     '?' (its pair mapping in a flow list, an empty key, an empty value):
//     the '?', counted three times.
//   - A '-' is counted twice: its list and a mapping that starts after it
//     on its line. A '[' is counted twice: its list and the pair mapping of
//     its last entry, in case yaml.v3 fails before that entry ends.
//   - A line break after a ']' or '}' that closed a known collection (see
//     below) and blanks owns nothing above, and is not counted; CR LF is
//     one line break.
//   - An entry of a flow list that is a pair (`[a: b]` holds the mapping
//     {a: b}), or of a flow mapping that has no ':' (`{a, b}` gives a and b
//     empty values), makes one node more: the ',', ']' or '}' ending the
//     entry is counted once more unless the entry is empty (`[]`, `[a, ]`)
//     or sure to be neither. It is sure when the last '[' or '{' before
//     it is known to open the entry's collection, nothing between them
//     being able to hide a bracket (a quote, a comment, a tag, an anchor
//     or alias), and whether the entry holds a ':' before a blank (which
//     yaml.v3 takes as an indicator, never into a plain scalar, in a flow
//     collection) matches the collection: a list entry without one, a
//     mapping entry with one.
//
// A file yaml.v3 refuses stops being parsed at the error, having built
// part of the tree: bounded the same way, less the one unfinished entry
// whose end it never reached (in the constant).
func nodeBound(data []byte) int {
	if len(data) >= 2 && (data[0] == 0xFF && data[1] == 0xFE || data[0] == 0xFE && data[1] == 0xFF) {
		data = utf16ToUTF8(data)
	}
	// Two documents (Parse reads a second one to refuse it), the mapping
	// at the start of the file, what the end of the file ends, and an
	// unfinished flow entry of a file yaml.v3 refuses.
	n := 8
	// flow is what the last '[' or '{' opened when nothing since could
	// have hidden a bracket; colon is whether a ':' before a blank came
	// since the last bracket or ','.
	const (
		unsure = iota
		inList
		inMapping
	)
	flow, colon := unsure, false
	comment := false // a '#' on this line
	tag := false     // a '!' not yet ended by a blank
	closed := false  // a ']' or '}' that closed a known collection, then only blanks
	empty := false   // only blanks since a '[', '{' or ',': no entry yet
	entryEnd := func() {
		if !empty && (flow == unsure || (flow == inList) == colon) {
			n++
		}
		colon = false
	}
	lineBreak := func() {
		if !closed {
			n++
		}
		if comment {
			flow = unsure // a bracket in the comment counted for nothing
		}
		comment, tag, closed = false, false, false
	}
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			closed = false
			if c != ',' && c != ']' && c != '}' {
				empty = false
			}
		}
		switch c {
		case '\n':
			lineBreak()
		case '\r':
			if i+1 == len(data) || data[i+1] != '\n' { // CRLF is one break
				lineBreak()
			}
		case 0xC2, 0xE2: // NEL, LS and PS break lines too
			if w := breakWidth(data, i); w > 0 {
				lineBreak()
				i += w - 1
			}
		case ' ', '\t':
			tag = false
		case ':':
			if blankAt(data, i+1) {
				n++
				colon = true
			}
		case ',':
			n++
			entryEnd()
			empty = true
		case ']', '}':
			n++
			closed = flow != unsure
			entryEnd()
			flow, empty = unsure, false
		case '[', '{':
			n++
			if c == '[' {
				n++
			}
			colon, empty = false, true
			switch {
			case tag: // tags may hold brackets
				flow = unsure
			case c == '[':
				flow = inList
			default:
				flow = inMapping
			}
		case '-':
			if blankAt(data, i+1) {
				n += 2
			}
		case '?':
			n += 3
		case '#':
			if i > 0 && (data[i-1] == ' ' || data[i-1] == '\t') {
				n++ // a plain scalar before it on its line ends here
			}
			comment, flow = true, unsure
		case '!':
			n++
			tag, flow = true, unsure
		case '&', '*':
			n++
			flow = unsure
		case '"', '\'':
			if tokenStart(data, i) {
				n++
			}
			flow = unsure
		case '|', '>':
			if afterBlank(data, i) {
				n++
			}
		}
	}
	return n
}

// blankAt reports whether data[i] is what yaml.v3 calls blankz: a space, a
// tab, a line break, NUL or the end of the file.
func blankAt(data []byte, i int) bool {
	if i >= len(data) {
		return true
	}
	switch data[i] {
	case ' ', '\t', '\n', '\r', 0:
		return true
	}
	return breakWidth(data, i) > 0
}

// afterBlank reports whether data[i] starts the file or follows a blank or
// a line break: where a comment, a block scalar or a token may start.
func afterBlank(data []byte, i int) bool {
	if i == 0 {
		return true
	}
	switch data[i-1] {
	case ' ', '\t', '\n', '\r':
		return true
	case 0x85, 0xA8, 0xA9:
		return i >= 2 && breakWidth(data, i-2) == 2 || i >= 3 && breakWidth(data, i-3) == 3
	}
	return false
}

// tokenStart reports whether a quoted scalar may start at data[i]: after a
// blank, a line break, a byte order mark, or an indicator that can
// directly precede one ('[', '{', ',', ':', '?').
func tokenStart(data []byte, i int) bool {
	if afterBlank(data, i) || i == 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF {
		return true
	}
	switch data[i-1] {
	case '[', '{', ',', ':', '?':
		return true
	}
	return false
}

// breakWidth is the length of the line break that starts at data[i] among
// those yaml.v3 takes besides CR and LF (NEL, LS, PS), or 0.
func breakWidth(data []byte, i int) int {
	switch {
	case i+1 < len(data) && data[i] == 0xC2 && data[i+1] == 0x85:
		return 2
	case i+2 < len(data) && data[i] == 0xE2 && data[i+1] == 0x80 && (data[i+2] == 0xA8 || data[i+2] == 0xA9):
		return 3
	}
	return 0
}

// utf16ToUTF8 is what yaml.v3 reads a file starting with a UTF-16 byte
// order mark as, so that nodeBound sees its line breaks.
func utf16ToUTF8(data []byte) []byte {
	units := make([]uint16, 0, len(data)/2)
	for i := 0; i+1 < len(data); i += 2 {
		if data[0] == 0xFF {
			units = append(units, uint16(data[i])|uint16(data[i+1])<<8)
		} else {
			units = append(units, uint16(data[i])<<8|uint16(data[i+1]))
		}
	}
	out := make([]byte, 0, len(data))
	for _, r := range utf16.Decode(units) {
		out = utf8.AppendRune(out, r)
	}
	return out
}
