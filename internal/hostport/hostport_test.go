package hostport

import (
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

func TestAppend(t *testing.T) {
	tests := []struct {
		authority string
		ok        bool
		out       string
		host      string
	}{
		{"API.Stripe.com", true, "api.stripe.com:80", "api.stripe.com"},
		{"api.stripe.com:8443", true, "api.stripe.com:8443", "api.stripe.com"},
		{"127.0.0.1:9000", true, "127.0.0.1:9000", "127.0.0.1"},
		{"[::1]:9000", true, "[::1]:9000", "[::1]"},
		{"[::1]", true, "[::1]:80", "[::1]"},
		{"[0:0::1]:080", true, "[::1]:80", "[::1]"},
		{"[2001:DB8::1]", true, "[2001:db8::1]:80", "[2001:db8::1]"},
		{"h.test:080", true, "h.test:80", "h.test"},
		{"h.test:0000080", true, "h.test:80", "h.test"},
		{"h.test:00", false, "", ""},
		{"svc_name.internal", true, "svc_name.internal:80", "svc_name.internal"},
		{"API.stripe.com.:443", true, "api.stripe.com:443", "api.stripe.com"},
		{"localhost.", true, "localhost:80", "localhost"},
		{".", false, "", ""},
		{"h..:80", false, "", ""},
		{"user@host", false, "", ""},
		{"host:", false, "", ""},
		{"host:0", false, "", ""},
		{"host:65536", false, "", ""},
		{"host:80a", false, "", ""},
		{":80", false, "", ""},
		{"", false, "", ""},
		{"[::1", false, "", ""},
		{"[]:80", false, "", ""},
		{"[::1]x", false, "", ""},
		{"a b", false, "", ""},
		{"h%41", false, "", ""},
	}
	for _, tc := range tests {
		out, n, ok := Append([]byte("prefix"), []byte(tc.authority), "80")
		if ok != tc.ok {
			t.Errorf("Append(%q) ok = %v, want %v", tc.authority, ok, tc.ok)
			continue
		}
		if !ok {
			if string(out) != "prefix" {
				t.Errorf("Append(%q) failed but changed dst to %q", tc.authority, out)
			}
			continue
		}
		got := string(out[len("prefix"):])
		if got != tc.out || got[:n] != tc.host {
			t.Errorf("Append(%q) = %q host %q, want %q host %q", tc.authority, got, got[:n], tc.out, tc.host)
		}
	}
}

// FuzzAuthority checks the egress routing key against the standard
// library's reading of the same authority: whatever Append accepts,
// net/url and net.SplitHostPort must read as the same host and port.
func FuzzAuthority(f *testing.F) {
	for _, s := range []string{"api.stripe.com", "API.stripe.com:443", "[::1]:80", "a@b", "h:0", "[fe80::1%25en0]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, authority string) {
		out, n, ok := Append(nil, []byte(authority), "80")
		if !ok {
			return
		}
		host, port, err := net.SplitHostPort(string(out))
		if err != nil {
			t.Fatalf("%q → %q, which net.SplitHostPort refuses: %v", authority, out, err)
		}
		if strings.ToLower(host) != host {
			t.Fatalf("%q → host %q not lower case", authority, host)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			t.Fatalf("%q → bad port %q", authority, port)
		}
		if want := strings.Trim(string(out[:n]), "[]"); want != host {
			t.Fatalf("%q → host part %q, SplitHostPort says %q", authority, out[:n], host)
		}
		u, err := url.Parse("http://" + authority + "/")
		if err != nil {
			t.Fatalf("%q accepted but net/url refuses it: %v", authority, err)
		}
		// The same host and port, spelled canonically: an IPv6 literal in
		// its canonical form, the port without leading zeros, a name
		// without its final dot.
		urlHost := strings.TrimSuffix(u.Hostname(), ".")
		if a, err := netip.ParseAddr(urlHost); err == nil && a.Is6() {
			urlHost = a.String()
		}
		if !strings.EqualFold(urlHost, host) {
			t.Fatalf("%q → host %q, net/url reads %q", authority, host, u.Hostname())
		}
		if u.Port() != "" {
			if p, err := strconv.Atoi(u.Port()); err != nil || strconv.Itoa(p) != port {
				t.Fatalf("%q → port %q, net/url reads %q", authority, port, u.Port())
			}
		}
		// A policy entry written as the request's authority routes it:
		// Key of the entry equals the request's lookup key (host:port
		// when the entry names a port, else the host).
		key, err := Key(authority)
		if err != nil {
			t.Fatalf("request authority %q accepted, policy entry refused: %v", authority, err)
		}
		if want := string(out[:n]); u.Port() != "" {
			want = string(out)
			if key != want {
				t.Fatalf("entry %q → key %q, request → %q", authority, key, want)
			}
		} else if key != want {
			t.Fatalf("entry %q → key %q, request host → %q", authority, key, want)
		}
	})
}

func TestKey(t *testing.T) {
	for entry, want := range map[string]string{
		"API.Stripe.com":      "api.stripe.com",
		"api.stripe.com:8443": "api.stripe.com:8443",
		"[::1]:7":             "[::1]:7",
		"::1":                 "[::1]",
		"[0:0::1]:0080":       "[::1]:80",
		"H.test:080":          "h.test:80",
		"10.0.0.1":            "10.0.0.1",
	} {
		if got, err := Key(entry); err != nil || got != want {
			t.Errorf("Key(%q) = %q, %v; want %q", entry, got, err, want)
		}
	}
	if _, err := Key("a b"); err == nil {
		t.Error("Key accepted a bad host")
	}
}

func TestSelfAddressed(t *testing.T) {
	tests := []struct {
		self, authority string
		want            bool
	}{
		{"127.0.0.1:15001", "127.0.0.1:15001", true},
		{"127.0.0.1:15001", "localhost:15001", true},
		{"127.0.0.1:15001", "127.0.0.2:15001", true},
		{"127.0.0.1:15001", "[::1]:15001", true},
		{"127.0.0.1:15001", "0.0.0.0:15001", true},
		{"10.1.2.3:15001", "10.1.2.3:15001", true},
		{"[::]:15001", "[::]:15001", true},
		{"127.0.0.1:15001", "127.0.0.1:15002", false},
		{"127.0.0.1:15001", "127.0.0.1", false}, // port 80
		{"10.1.2.3:15001", "10.1.2.4:15001", false},
		{"127.0.0.1:15001", "api.test:15001", false},
		{"not an address", "127.0.0.1:15001", false},
	}
	for _, tc := range tests {
		hp, n, ok := Append(nil, []byte(tc.authority), "80")
		if !ok {
			t.Fatalf("Append(%q) refused", tc.authority)
		}
		if got := SelfAddressed(tc.self, hp, n); got != tc.want {
			t.Errorf("SelfAddressed(%q, %q) = %v, want %v", tc.self, hp, got, tc.want)
		}
	}
}
