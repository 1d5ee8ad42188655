package jsonstr

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppend(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"", `""`},
		{"acme", `"acme"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"a\nb\rc\td", `"a\nb\rc\td"`},
		{"bell\a", `"bell\u0007"`},
		{"nul\x00", `"nul\u0000"`},
		{"del\x7f", "\"del\x7f\""},
		{"caf\xe9", `"caf\ufffd"`},
		{"café", `"café"`},
		{"\U000f0000", "\"\U000f0000\""},
		{"line\u2028para\u2029", `"line\u2028para\u2029"`},
		{"tenant:acme", `"tenant:acme"`},
	} {
		got := string(Append([]byte("x"), tc.in))
		if got != "x"+tc.want {
			t.Errorf("Append(%q) = %s, want %s", tc.in, got[1:], tc.want)
		}
	}
}

func TestAppendAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = Append(buf[:0], "tenant:caf\xe9\a") }); n != 0 {
		t.Fatalf("Append allocated %v times", n)
	}
}

// FuzzAppend: whatever the bytes, the result is one valid JSON string that
// decodes to the input, with invalid UTF-8 replaced as encoding/json does.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "acme", "a\"\\\n\x00\x7f", "caf\xe9", "\u2028", "\xf4\x90\x80\x80", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Append(nil, s)
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("Append(%q) = %s: not JSON: %v", s, out, err)
		}
		if want := replaced(s); got != want {
			t.Fatalf("Append(%q) decodes to %q, want %q", s, got, want)
		}
	})
}

// replaced is s with every invalid byte replaced by U+FFFD, one for one
// (strings.ToValidUTF8 folds a run into one).
func replaced(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r)
		i += size
	}
	return b.String()
}
