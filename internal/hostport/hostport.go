// Package hostport normalises hosts and ports, so that a request's
// authority and a policy's host entry can be compared as strings. The
// policy layer and the data plane both use it; it depends on neither.
package hostport

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Append appends the normalised form of an authority (host[:port])
// to dst: host in lower case, IPv6 literals in brackets and in their
// canonical spelling, the port without leading zeros, and defaultPort
// filled in when the authority has none, and a fully qualified name's
// final dot dropped. Two spellings of one host and port ("h:080",
// "[0:0::1]", "h.") thus name the same target. It returns the
// extended dst and the length of the host part within the appended bytes.
// ok is false for anything that is not a plain host (a user-info part, an
// empty host, bad characters, a port that is not 1-65535).
func Append(dst, authority []byte, defaultPort string) (out []byte, hostLen int, ok bool) {
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

// Key normalises a targets[].hosts entry the way Append
// normalises requests, so the two can be compared as strings: lower case,
// IPv6 in brackets, "host:port" when the entry names a port (it matches
// that port only), "host" otherwise (any port).
func Key(entry string) (string, error) {
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
	out, n, ok := Append(nil, []byte(authority), "1")
	if !ok {
		return "", fmt.Errorf("host %q cannot be matched against requests", entry)
	}
	if port == "" {
		return string(out[:n]), nil
	}
	return string(out), nil
}

// SelfAddressed reports whether a request for hostport (as Append
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
