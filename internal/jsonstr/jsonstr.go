// Package jsonstr appends strings to hand-built JSON documents.
//
// The data plane writes its small refusal bodies by appending to a byte
// slice rather than through encoding/json, to keep them allocation-free.
// Go's strconv quoting is not JSON: it writes \a, \x7f and \U000f0000,
// which JSON parsers refuse, and passes invalid UTF-8 through as \xNN.
// The strings quoted here come from requests (a tenant header, an RLS
// descriptor value, a Host), so they can hold any byte.
package jsonstr

import "unicode/utf8"

const hex = "0123456789abcdef"

// Append appends s to dst as a JSON string, quotes included. Control
// characters are escaped, invalid UTF-8 becomes U+FFFD (as encoding/json
// does), and U+2028 and U+2029 are escaped so the result is also safe
// inside JavaScript.
func Append(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
