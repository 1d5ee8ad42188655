package pgstore

import (
	"strings"
	"testing"
)

func TestFirstSchema(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", ""},
		{"warden", "warden"},
		{"  Warden , public", "warden"},
		{`"Warden", public`, "Warden"},
		{`"a,b"`, "a,b"},
		{`"say ""hi"""`, `say "hi"`},
		{`$user, public`, ""},
		{`"$user", public`, ""},
		{`"unterminated`, ""},
		{"tenant_1,other", "tenant_1"},
	}
	for _, c := range cases {
		if got := firstSchema(c.in); got != c.want {
			t.Errorf("firstSchema(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// FuzzFirstSchema: any setting parses without panicking; an unquoted result
// is folded and holds no separator; whatever name comes out, quoted back
// and followed by more entries, parses to itself.
func FuzzFirstSchema(f *testing.F) {
	for _, s := range []string{"warden", `"A,b", public`, `$user`, `"x""y"`, " Mixed ,z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sp string) {
		got := firstSchema(sp)
		if !strings.HasPrefix(strings.TrimLeft(sp, " \t\n\r"), `"`) {
			if strings.Contains(got, ",") || got != asciiLower(got) {
				t.Fatalf("firstSchema(%q) = %q: an unquoted name is folded and ends at a comma", sp, got)
			}
		}
		if got == "" {
			return
		}
		quoted := `"` + strings.ReplaceAll(got, `"`, `""`) + `", public`
		if back := firstSchema(quoted); back != got {
			t.Fatalf("firstSchema(%q) = %q, but quoted back it parses as %q", sp, got, back)
		}
	})
}
