package policy

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
)

var errorLine = regexp.MustCompile(`^[^:]+:\d+:\d+: `)

// FuzzParse: whatever the bytes, Parse returns (it never panics or hangs),
// and every error line is FILE:LINE:COL: message, at most MaxErrors of
// them, then "... and N more errors" when there are more.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile(examplePath); err == nil {
		f.Add(data)
	}
	for _, tc := range errorCases {
		f.Add([]byte(tc.src))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("fuzz.yaml", data)
		if err == nil {
			if p == nil {
				t.Fatal("nil policy without an error")
			}
			for _, w := range p.Warnings {
				if !errorLine.MatchString(w.String()) || strings.ContainsAny(w.String(), "\r\n") {
					t.Fatalf("malformed warning %q", w.String())
				}
			}
			return
		}
		if p != nil {
			t.Fatal("policy returned with errors")
		}
		var errs Errors
		if !errors.As(err, &errs) || len(errs.Issues) == 0 {
			t.Fatalf("error is not a non-empty Errors: %T %v", err, err)
		}
		if len(errs.Issues) > MaxErrors || (errs.More > 0 && len(errs.Issues) != MaxErrors) {
			t.Fatalf("%d issues listed and %d more counted", len(errs.Issues), errs.More)
		}
		lines := strings.Split(err.Error(), "\n")
		if errs.More > 0 {
			if last := lines[len(lines)-1]; last != moreLine(errs.More, "error") {
				t.Fatalf("last line %q, want %q", last, moreLine(errs.More, "error"))
			}
			lines = lines[:len(lines)-1]
		}
		if len(lines) != len(errs.Issues) {
			t.Fatalf("%d issues printed as %d lines", len(errs.Issues), len(lines))
		}
		for _, l := range lines {
			if !errorLine.MatchString(l) {
				t.Fatalf("malformed error line %q", l)
			}
		}
	})
}
