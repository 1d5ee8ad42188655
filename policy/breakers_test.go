package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestBreakerLeaders(t *testing.T) {
	tests := []struct {
		name    string
		targets string // targets: entries
		want    []int
	}{
		{"same upstream host:port", `
  - { name: a, hosts: [a.test], upstream: "http://api.test:8080", circuit_breaker: { enabled: true } }
  - { name: b, hosts: [b.test], upstream: "http://API.test:8080", circuit_breaker: { enabled: true } }`, []int{0, 0}},
		{"default ports", `
  - { name: a, hosts: [a.test], upstream: "https://api.test", circuit_breaker: { enabled: true } }
  - { name: b, hosts: [b.test], upstream: "https://api.test:443", circuit_breaker: { enabled: true } }
  - { name: c, hosts: [c.test], upstream: "http://api.test", circuit_breaker: { enabled: true } }`, []int{0, 0, 2}},
		{"other port of the host", `
  - { name: a, hosts: [a.test], upstream: "http://127.0.0.1:1", circuit_breaker: { enabled: true } }
  - { name: b, hosts: [b.test], upstream: "http://127.0.0.1:2", circuit_breaker: { enabled: true } }`, []int{0, 1}},
		{"listed host without upstream", `
  - { name: a, hosts: [a.test], upstream: "http://pay.test:9000", circuit_breaker: { enabled: true } }
  - { name: b, hosts: ["pay.test:9000"], circuit_breaker: { enabled: true } }`, []int{0, 0}},
		{"a host without a port is every port", `
  - { name: a, hosts: ["sh.test:8000"], circuit_breaker: { enabled: true } }
  - { name: b, hosts: ["sh.test"], circuit_breaker: { enabled: true } }`, []int{0, 0}},
		{"transitive, led by the first", `
  - { name: a, hosts: [a.test], upstream: "http://x.test:1", circuit_breaker: { enabled: true } }
  - { name: b, hosts: [b.test], upstream: "http://y.test:1", circuit_breaker: { enabled: true } }
  - { name: c, hosts: ["x.test", "y.test"], circuit_breaker: { enabled: true } }`, []int{0, 0, 0}},
		{"a disabled breaker shares nothing", `
  - { name: a, hosts: [a.test], upstream: "http://api.test", circuit_breaker: { enabled: true } }
  - { name: b, hosts: [b.test], upstream: "http://api.test" }
  - { name: c, hosts: [c.test], upstream: "http://api.test", circuit_breaker: { enabled: true } }`, []int{0, 1, 0}},
		{"gRPC targets are not HTTP hosts", `
  - { name: a, hosts: [a.test], upstream: "http://api.test:80", circuit_breaker: { enabled: true } }
  - { name: g, grpc_service: pay.v1.Pay, upstream: "http://api.test:80", circuit_breaker: { enabled: true } }`, []int{0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("t.yaml", []byte("version: 1\negress:\n  http_listen: 127.0.0.1:0\n  grpc_listen: 127.0.0.1:0\ntargets:"+tc.targets+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.BreakerLeaders(); !slices.Equal(got, tc.want) {
				t.Fatalf("leaders %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSharedBreakerWarnings(t *testing.T) {
	p, err := Parse("t.yaml", []byte(`version: 1
egress: { http_listen: 127.0.0.1:0 }
targets:
  - { name: a, hosts: [a.test], upstream: "http://api.test", circuit_breaker: { enabled: true, open: 5s } }
  - { name: b, hosts: [b.test], upstream: "http://api.test", circuit_breaker: { enabled: true, open: 5s } }
  - { name: c, hosts: [c.test], upstream: "http://api.test", circuit_breaker: { enabled: true, open: 10s, minimum_requests: 3 } }
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != 1 {
		t.Fatalf("want one warning (c differs from a; b agrees), got %v", p.Warnings)
	}
	got := p.Warnings[0].String()
	for _, want := range []string{"t.yaml:6:", `target "c"`, `target "a" (line 4)`, "minimum_requests 10 vs 3", "open 5s vs 10s"} {
		if !strings.Contains(got, want) {
			t.Errorf("warning %q lacks %q", got, want)
		}
	}
}
