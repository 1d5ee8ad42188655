package scheduler

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestKeyExpr(t *testing.T) {
	headers := map[string]string{"x-tenant-id": "acme", "x-region": "eu"}
	hdr := func(name string) []byte { return []byte(headers[strings.ToLower(name)]) }
	tests := []struct {
		expr, input, want string
	}{
		{"${input.tenantId}", `{"tenantId":"acme"}`, "acme"},
		{"${input.tenantId}", `{"tenantId":42}`, "42"},
		{"${input.tenantId}", `{"tenantId":1.50}`, "1.50"},
		{"${input.tenantId}", `{"tenantId":true}`, "true"},
		{"${input.tenantId}", `{"tenantId":null}`, "${input.tenantId}"},
		{"${input.tenantId}", `{}`, "${input.tenantId}"},
		{"${input.tenantId}", `[1,2]`, "${input.tenantId}"},
		{"${input.tenantId}", `{"tenantId":"a\"b\u00e9"}`, "a\"bé"},
		{"${input.t}", `{"t":{"b": [1, 2]}}`, `{"b":[1,2]}`},
		{"${input.a.b.c}", `{"a":{"x":[{"b":1}],"b":{"c":"deep"}}}`, "deep"},
		{"${input.a.b}", `{"a":{"b":"first"},"a":{"b":"last"}}`, "last"},
		{"${input.a}", ` { "a" : "spaced" } `, "spaced"},
		{"tenant-${input.id}/${header.x-region}", `{"id":"7"}`, "tenant-7/eu"},
		{"tenant-${input.id}/${header.x-missing}", `{"id":"7"}`, "tenant-${input.id}/${header.x-missing}"},
		{"${header.X-Tenant-Id}", `{}`, "acme"},
	}
	for _, tc := range tests {
		k, err := compileKey(tc.expr)
		if err != nil {
			t.Errorf("compileKey(%q): %v", tc.expr, err)
			continue
		}
		if got := k.resolve([]byte(tc.input), hdr); got != tc.want {
			t.Errorf("%s on %s = %q, want %q", tc.expr, tc.input, got, tc.want)
		}
	}
}

func TestKeyExprErrors(t *testing.T) {
	for expr, want := range map[string]string{
		"plain":            "no ${input.<path>}",
		"${input.a":        "unterminated",
		"${body.a}":        "must be ${input.<path>} or ${header.<name>}",
		"${input.}":        "must be",
		"${input.a..b}":    "must be",
		"${header.a b}":    "must be",
		"${input.k\u00e9}": "must be",
		"x-${input.a}-${":  "unterminated",
	} {
		if _, err := compileKey(expr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("compileKey(%q) = %v, want an error containing %q", expr, err, want)
		}
	}
	if k, err := compileKey(""); k != nil || err != nil {
		t.Errorf("empty key: %v %v, want no key and no error", k, err)
	}
}

// FuzzLookupJSON holds the hand-written path walker to encoding/json: on
// valid documents both find the same scalar; on anything else the walker
// must not panic.
func FuzzLookupJSON(f *testing.F) {
	for _, s := range []string{`{"a":"x"}`, `{"a":{"b":[1,{"c":2}]}}`, `{"a":1e5,"a":-0.5}`, `{"a":"\ud83d\ude00"}`,
		`{"a\u0062":true}`, `[{"a":1}]`, `{"a":null}`, `{"a" : { "b" : "y" } }`, `{"a":"x\\"}`} {
		f.Add([]byte(s), "a")
		f.Add([]byte(s), "a.b")
	}
	f.Fuzz(func(t *testing.T, doc []byte, path string) {
		if !inputPathRE.MatchString(path) {
			return
		}
		parts := strings.Split(path, ".")
		got, ok := lookupJSON(doc, parts)
		if !json.Valid(doc) {
			return
		}
		want, wantOK := reference(doc, parts)
		if ok != wantOK {
			t.Fatalf("lookup %q in %s: found=%v, encoding/json found=%v", path, doc, ok, wantOK)
		}
		if ok && want != nil && got != *want {
			t.Fatalf("lookup %q in %s = %q, encoding/json %q", path, doc, got, *want)
		}
	})
}

// reference resolves path with encoding/json. It returns a nil string for
// objects and arrays, whose rendering legitimately differs (key order).
func reference(doc []byte, path []string) (*string, bool) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil, false
	}
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[p]; !ok {
			return nil, false
		}
	}
	var s string
	switch x := v.(type) {
	case nil:
		return nil, false
	case string:
		s = x
	case json.Number:
		s = x.String()
	case bool:
		s = "false"
		if x {
			s = "true"
		}
	default:
		return nil, true
	}
	return &s, true
}

// FuzzKeyExpr: any expression either fails to compile with an error or
// resolves without panicking; an unresolvable key is the expression itself.
func FuzzKeyExpr(f *testing.F) {
	f.Add("${input.a}", []byte(`{"a":"x"}`), "v")
	f.Add("t-${header.h}-${input.a.b}", []byte(`{"a":{"b":1}}`), "")
	f.Add("${", []byte(`{}`), "")
	f.Fuzz(func(t *testing.T, expr string, input []byte, hv string) {
		k, err := compileKey(expr)
		if err != nil || k == nil {
			return
		}
		got := k.resolve(input, func(string) []byte { return []byte(hv) })
		if hv == "" && strings.Contains(expr, "${header.") && got != expr {
			t.Fatalf("%q with no header resolved to %q, want the expression", expr, got)
		}
	})
}
