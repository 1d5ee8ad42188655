package httpwire

import (
	"bufio"
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestSetForwarded(t *testing.T) {
	v4 := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5000} // 16-byte, v4-mapped
	v6 := &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 5000}
	unix := &net.UnixAddr{Name: "/run/warden.sock", Net: "unix"}
	tests := []struct {
		name      string
		headers   string
		peer      net.Addr
		wantFor   []string // every X-Forwarded-For line, in order
		wantProto string
	}{
		{"none", "", v4, []string{"192.0.2.7"}, "http"},
		{"ipv6 peer", "", v6, []string{"2001:db8::1"}, "http"},
		{"appended", "X-Forwarded-For: 203.0.113.1\r\n", v4, []string{"203.0.113.1, 192.0.2.7"}, "http"},
		{"chain kept", "x-forwarded-for: 203.0.113.1,198.51.100.2\r\n", v4, []string{"203.0.113.1, 198.51.100.2, 192.0.2.7"}, "http"},
		{"lines joined", "X-Forwarded-For: 203.0.113.1\r\nX-Other: a\r\nX-Forwarded-For: 198.51.100.2\r\n", v4,
			[]string{"203.0.113.1, 198.51.100.2, 192.0.2.7"}, "http"},
		{"empty members dropped", "X-Forwarded-For: , 203.0.113.1 ,,\r\nX-Forwarded-For:\r\n", v4, []string{"203.0.113.1, 192.0.2.7"}, "http"},
		{"proto kept", "X-Forwarded-Proto: https\r\n", v4, []string{"192.0.2.7"}, "https"},
		{"unix peer keeps the chain", "X-Forwarded-For: 203.0.113.1\r\nX-Forwarded-For: 198.51.100.2\r\n", unix,
			[]string{"203.0.113.1, 198.51.100.2"}, "http"},
		{"unix peer and only empty lines", "X-Forwarded-For: ,\r\n", unix, nil, "http"},
		{"unix peer, nothing", "", unix, nil, "http"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			raw := "GET / HTTP/1.1\r\nHost: svc\r\n" + tc.headers + "\r\n"
			if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			s, err := ScanRequestHeaders(h.RawHeaders(), "")
			if err != nil {
				t.Fatal(err)
			}
			SetForwarded(&h, s.Fields, tc.peer)
			var got []string
			for _, v := range h.PeekAll(fasthttp.HeaderXForwardedFor) {
				got = append(got, string(v))
			}
			if strings.Join(got, "|") != strings.Join(tc.wantFor, "|") {
				t.Errorf("X-Forwarded-For lines %q, want %q", got, tc.wantFor)
			}
			if p := h.PeekAll(fasthttp.HeaderXForwardedProto); len(p) != 1 || string(p[0]) != tc.wantProto {
				t.Errorf("X-Forwarded-Proto %q, want one %q", p, tc.wantProto)
			}
		})
	}
}

func TestSetForwardedNoAllocations(t *testing.T) {
	var h fasthttp.RequestHeader
	raw := []byte("GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: 203.0.113.1\r\n\r\n")
	peer := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5000}
	rd := bytes.NewReader(raw)
	br := bufio.NewReader(rd)
	allocs := testing.AllocsPerRun(100, func() {
		h.Reset()
		rd.Reset(raw)
		br.Reset(rd)
		if err := h.Read(br); err != nil {
			t.Fatal(err)
		}
		SetForwarded(&h, HasForwardedFor, peer)
	})
	if allocs != 0 {
		t.Errorf("%v allocations a request, want 0", allocs)
	}
}

// FuzzForwardedFor: whatever chain a client sends, the worker gets its
// non-empty members, trimmed, in order, then the peer, on one line.
func FuzzForwardedFor(f *testing.F) {
	for _, s := range []string{"", "203.0.113.1", " a , ,b,", ",,,", "2001:db8::1, 10.0.0.1", "\t x\t,y "} {
		f.Add(s, s)
	}
	peer := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5000}
	f.Fuzz(func(t *testing.T, first, second string) {
		var h fasthttp.RequestHeader
		raw := "GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: " + first + "\r\nX-Forwarded-For: " + second + "\r\n\r\n"
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Skip() // not a head fasthttp reads: never reaches SetForwarded
		}
		s, err := ScanRequestHeaders(h.RawHeaders(), "")
		if err != nil {
			t.Skip() // refused with 400 before forwarding
		}
		var want []string
		for _, v := range h.PeekAll(fasthttp.HeaderXForwardedFor) {
			for _, m := range strings.Split(string(v), ",") {
				if m = strings.Trim(m, " \t"); m != "" {
					want = append(want, m)
				}
			}
		}
		want = append(want, "192.0.2.7")
		SetForwarded(&h, s.Fields, peer)
		got := h.PeekAll(fasthttp.HeaderXForwardedFor)
		if len(got) != 1 || string(got[0]) != strings.Join(want, ", ") {
			t.Fatalf("X-Forwarded-For %q, want one line %q", got, strings.Join(want, ", "))
		}
	})
}
