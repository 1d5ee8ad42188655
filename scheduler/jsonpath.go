// lookupJSON exists because a definition key (${input.a.b}) is resolved
// at every submit, and a walk that decodes each level into a map of
// json.RawMessage costs 5-10x the time and 15-41 allocations where this
// scanner makes one (the key string). Medians of 5 on 2 shared cores:
//
//	go test -run '^$' -bench LookupJSON -benchmem -count=5 ./scheduler
//
//	input (bytes)    scanner           json.RawMessage walk
//	small (37)       403 ns, 1 alloc   4.4 µs, 15 allocs
//	nested (99)      940 ns, 1 alloc   9.2 µs, 34 allocs
//	large (2401)     27.7 µs, 1 alloc  143 µs, 41 allocs
//
// tidwall/gjson is faster still (0.2 µs / 0.2 µs / 2.6 µs) but takes the
// first of repeated names where encoding/json, and so this scanner, takes
// the last: it would change which key a run gets.

package scheduler

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// lookupJSON finds the value at a dotted path in a JSON document without
// decoding the rest of it, and renders it as key text: a string's contents,
// a number or boolean as written, an object or array as compact JSON. A
// missing path or null is not found. An object that repeats a name uses the
// last occurrence, as encoding/json does. Input that is not valid JSON
// finds nothing; it never panics (FuzzLookupJSON holds it to encoding/json).
func lookupJSON(doc []byte, path []string) (string, bool) {
	v := doc
	for _, name := range path {
		var ok bool
		if v, ok = member(v, name); !ok {
			return "", false
		}
	}
	return render(v)
}

// member returns the raw value of name in the object v (leading whitespace
// allowed).
func member(v []byte, name string) ([]byte, bool) {
	s := scanner{b: v}
	s.space()
	if !s.take('{') {
		return nil, false
	}
	var found []byte
	ok := false
	s.space()
	if s.take('}') {
		return nil, false
	}
	for {
		s.space()
		k, good := s.str()
		if !good {
			return nil, false
		}
		s.space()
		if !s.take(':') {
			return nil, false
		}
		s.space()
		start := s.i
		if !s.value(0) {
			return nil, false
		}
		if keyEquals(k, name) {
			found, ok = v[start:s.i], true
		}
		s.space()
		if s.take('}') {
			return found, ok
		}
		if !s.take(',') {
			return nil, false
		}
	}
}

// keyEquals compares a raw JSON string (quotes included) with name.
func keyEquals(raw []byte, name string) bool {
	inner := raw[1 : len(raw)-1]
	if plain(inner) {
		return string(inner) == name
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return false
	}
	return s == name
}

// plain reports whether a string's contents are its value as is: no
// escapes and valid UTF-8 (encoding/json turns invalid bytes into U+FFFD,
// and the key must not depend on which decoder read it).
func plain(inner []byte) bool {
	return bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner)
}

func render(v []byte) (string, bool) {
	s := scanner{b: v}
	s.space()
	v = bytes.TrimRight(v[s.i:], " \t\r\n")
	if len(v) == 0 {
		return "", false
	}
	switch v[0] {
	case 'n':
		return "", false
	case '"':
		if len(v) < 2 || v[len(v)-1] != '"' {
			return "", false
		}
		if inner := v[1 : len(v)-1]; plain(inner) {
			return string(inner), true
		}
		var out string
		if json.Unmarshal(v, &out) != nil {
			return "", false
		}
		return out, true
	case '{', '[':
		var b bytes.Buffer
		if json.Compact(&b, v) != nil {
			return "", false
		}
		return b.String(), true
	}
	return string(v), true
}

// scanner skips JSON values. It checks structure (brackets, strings,
// literals) but is lenient about number syntax; callers validate documents
// with json.Valid before they get here.
type scanner struct {
	b []byte
	i int
}

// maxDepth bounds nesting so a hostile document cannot recurse deeply.
const maxDepth = 1000

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) take(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str scans a string and returns it with its quotes.
func (s *scanner) str() ([]byte, bool) {
	start := s.i
	if !s.take('"') {
		return nil, false
	}
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '\\':
			s.i += 2
		case c == '"':
			s.i++
			return s.b[start:s.i], true
		case c < 0x20:
			return nil, false
		default:
			s.i++
		}
	}
	return nil, false
}

func (s *scanner) value(depth int) bool {
	if depth > maxDepth || s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.str()
		return ok
	case c == '{', c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		s.i++
		s.space()
		if s.take(end) {
			return true
		}
		for {
			s.space()
			if c == '{' {
				if _, ok := s.str(); !ok {
					return false
				}
				s.space()
				if !s.take(':') {
					return false
				}
				s.space()
			}
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.take(end) {
				return true
			}
			if !s.take(',') {
				return false
			}
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		for s.i < len(s.b) {
			switch d := s.b[s.i]; {
			case d >= '0' && d <= '9', d == '-', d == '+', d == '.', d == 'e', d == 'E':
				s.i++
			default:
				return true
			}
		}
		return true
	}
	return false
}

func (s *scanner) literal(word string) bool {
	if bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		s.i += len(word)
		return true
	}
	return false
}
