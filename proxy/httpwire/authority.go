package httpwire

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// SplitAbsoluteForm splits an absolute-form request target
// ("http://api.stripe.com:8080/v1/charges?x=1") into its scheme (lower
// case is not enforced), authority and origin-form rest ("/v1/charges?x=1";
// "/" when the path is empty, "/?q" when only a query follows). ok is false
// when uri is not absolute-form or the scheme is not http or https.
func SplitAbsoluteForm(uri []byte) (scheme, authority, origin []byte, ok bool) {
	i := bytes.Index(uri, []byte("://"))
	if i <= 0 {
		return nil, nil, nil, false
	}
	scheme = uri[:i]
	if !equalFold(scheme, "http") && !equalFold(scheme, "https") {
		return nil, nil, nil, false
	}
	rest := uri[i+3:]
	end := len(rest)
	for j, c := range rest {
		if c == '/' || c == '?' || c == '#' {
			end = j
			break
		}
	}
	authority, origin = rest[:end], rest[end:]
	if len(authority) == 0 {
		return nil, nil, nil, false
	}
	if k := bytes.IndexByte(origin, '#'); k >= 0 {
		origin = origin[:k] // fragments are never sent (RFC 9110 §4.2.4)
	}
	return scheme, authority, origin, true
}

// DefaultPort is the port a scheme implies.
func DefaultPort(scheme []byte) string {
	if equalFold(scheme, "https") {
		return "443"
	}
	return "80"
}

// AppendHostPort appends the normalised form of an authority (host[:port])
// to dst: host in lower case, IPv6 literals in brackets and in their
// canonical spelling, the port without leading zeros, and defaultPort
// filled in when the authority has none, and a fully qualified name's
// final dot dropped. Two spellings of one host and port ("h:080",
// "[0:0::1]", "h.") thus name the same target. It returns the
// extended dst and the length of the host part within the appended bytes.
// ok is false for anything that is not a plain host (a user-info part, an
// empty host, bad characters, a port that is not 1-65535).
func AppendHostPort(dst, authority []byte, defaultPort string) (out []byte, hostLen int, ok bool) {
	start := len(dst)
	host, port := authority, []byte(nil)
	if len(host) > 0 && host[0] == '[' {
		end := bytes.IndexByte(host, ']')
		if end < 0 {
			return dst, 0, false
		}
		a, err := netip.ParseAddr(string(host[1:end]))
		if err != nil || !a.Is6() || a.Zone() != "" {
			return dst, 0, false
		}
		rest := host[end+1:]
		if len(rest) > 0 {
			if rest[0] != ':' {
				return dst, 0, false
			}
			port = rest[1:]
			if len(port) == 0 {
				return dst, 0, false
			}
		}
		dst = append(dst, '[')
		dst = a.AppendTo(dst)
		dst = append(dst, ']')
	} else {
		if i := bytes.LastIndexByte(host, ':'); i >= 0 {
			host, port = host[:i], host[i+1:]
			if len(port) == 0 {
				return dst[:start], 0, false
			}
		}
		if len(host) == 0 {
			return dst, 0, false
		}
		for _, c := range host {
			if !isHostByte(c) {
				return dst[:start], 0, false
			}
		}
		// "api.example.com." is "api.example.com" spelled as an absolute
		// name: without this it would miss its target's controls.
		if host[len(host)-1] == '.' {
			host = host[:len(host)-1]
			if len(host) == 0 || host[len(host)-1] == '.' {
				return dst[:start], 0, false
			}
		}
		dst = appendLower(dst, host)
	}
	hostLen = len(dst) - start
	if port == nil {
		port = []byte(defaultPort)
	}
	for len(port) > 1 && port[0] == '0' {
		port = port[1:]
	}
	if !validPort(port) {
		return dst[:start], 0, false
	}
	dst = append(dst, ':')
	dst = append(dst, port...)
	return dst, hostLen, true
}

func validPort(p []byte) bool {
	if len(p) == 0 || len(p) > 5 {
		return false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n >= 1 && n <= 65535
}

func appendLower(dst, b []byte) []byte {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// isHostByte accepts the characters of DNS names and IPv4 literals (and
// "_", which real service names use). Percent-encoding and the other
// sub-delims RFC 3986 allows in a reg-name never name a routable host.
func isHostByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_'
}

// HostKey normalises a targets[].hosts entry the way AppendHostPort
// normalises requests, so the two can be compared as strings: lower case,
// IPv6 in brackets, "host:port" when the entry names a port (it matches
// that port only), "host" otherwise (any port).
func HostKey(entry string) (string, error) {
	host, port := entry, ""
	if h, p, err := net.SplitHostPort(entry); err == nil {
		host, port = h, p
	}
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	authority := host
	if port != "" {
		authority += ":" + port
	}
	out, n, ok := AppendHostPort(nil, []byte(authority), "1")
	if !ok {
		return "", fmt.Errorf("host %q cannot be matched against requests", entry)
	}
	if port == "" {
		return string(out[:n]), nil
	}
	return string(out), nil
}

// SelfAddressed reports whether a request for hostport (as AppendHostPort
// normalised it, its host hostLen bytes long) would come back to the
// listener bound to self (its "host:port" as net.Listener reports it): the
// same port, and a loopback, unspecified or identical host. A proxy that
// forwards to the host a request names refuses such requests rather than
// loop.
func SelfAddressed(self string, hostport []byte, hostLen int) bool {
	selfHost, selfPort, err := net.SplitHostPort(self)
	if err != nil || hostLen >= len(hostport) || string(hostport[hostLen+1:]) != selfPort {
		return false
	}
	host := bytes.Trim(hostport[:hostLen], "[]")
	if string(host) == "localhost" || string(host) == selfHost {
		return true
	}
	ip := net.ParseIP(string(host))
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}
