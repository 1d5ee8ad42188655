package httpwire

import (
	"strings"
	"testing"
)

func TestSplitAbsoluteForm(t *testing.T) {
	tests := []struct {
		uri                       string
		ok                        bool
		scheme, authority, origin string
	}{
		{"http://api.stripe.com/v1/charges?x=1", true, "http", "api.stripe.com", "/v1/charges?x=1"},
		{"HTTP://Api.Stripe.Com:8080", true, "HTTP", "Api.Stripe.Com:8080", ""},
		{"https://h?q=1", true, "https", "h", "?q=1"},
		{"http://h/p#frag", true, "http", "h", "/p"},
		{"http://[::1]:80/x", true, "http", "[::1]:80", "/x"},
		{"/v1/charges", false, "", "", ""},
		{"ftp://h/x", false, "", "", ""},
		{"http:///x", false, "", "", ""},
		{"api.stripe.com:443", false, "", "", ""},
	}
	for _, tc := range tests {
		s, a, o, ok := SplitAbsoluteForm([]byte(tc.uri))
		if ok != tc.ok || string(s) != tc.scheme || string(a) != tc.authority || string(o) != tc.origin {
			t.Errorf("SplitAbsoluteForm(%q) = %q %q %q %v, want %q %q %q %v", tc.uri, s, a, o, ok, tc.scheme, tc.authority, tc.origin, tc.ok)
		}
	}
}

func FuzzSplitAbsoluteForm(f *testing.F) {
	for _, s := range []string{"http://a/b?c", "https://[::1]:1/", "http://h#f", "/x", "http://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		scheme, authority, origin, ok := SplitAbsoluteForm([]byte(uri))
		if !ok {
			return
		}
		if len(authority) == 0 {
			t.Fatalf("%q: empty authority accepted", uri)
		}
		if len(origin) > 0 && origin[0] != '/' && origin[0] != '?' {
			t.Fatalf("%q: origin %q does not start with / or ?", uri, origin)
		}
		if strings.ContainsAny(string(authority), "/?#") || strings.Contains(string(origin), "#") {
			t.Fatalf("%q: split %q | %q", uri, authority, origin)
		}
		if !strings.HasPrefix(uri, string(scheme)+"://"+string(authority)+string(origin)) {
			t.Fatalf("%q: parts %q %q %q do not rebuild the target", uri, scheme, authority, origin)
		}
	})
}

func TestRequestIDs(t *testing.T) {
	g := NewRequestIDs()
	seen := map[string]bool{}
	for range 10000 {
		id := string(g.Append(nil))
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("bad id %q", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
	if a, b := string(NewRequestIDs().Append(nil)), string(NewRequestIDs().Append(nil)); a == b {
		t.Fatalf("two generators start alike: %q", a)
	}
}
