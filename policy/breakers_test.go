package policy

import (
	"math/rand/v2"
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

// breakerLeaders joins targets host by host; whatever the targets, its
// leaders are those of comparing every pair of them.
func TestBreakerLeadersMatchPairwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	hosts := []string{"a.test", "b.test", "c.test", "d.test"}
	ports := []string{"", ":1", ":2"}
	for round := range 500 {
		targets := make([]Target, 1+rng.IntN(12))
		for i := range targets {
			targets[i] = Target{CircuitBreaker: &CircuitBreaker{Enabled: rng.IntN(5) > 0}}
			for range 1 + rng.IntN(3) {
				targets[i].Hosts = append(targets[i].Hosts, hosts[rng.IntN(len(hosts))]+ports[rng.IntN(len(ports))])
			}
			if rng.IntN(3) == 0 {
				targets[i].Upstream = "http://" + hosts[rng.IntN(len(hosts))] + []string{"", ":1", ":80"}[rng.IntN(3)]
			}
		}
		if got, want := breakerLeaders(targets), pairwiseLeaders(targets); !slices.Equal(got, want) {
			t.Fatalf("round %d: leaders %v, want %v for %+v", round, got, want, targets)
		}
	}
}

// pairwiseLeaders is breakerLeaders by its definition: targets that send
// to an overlapping host share, transitively, led by the first.
func pairwiseLeaders(targets []Target) []int {
	dests := make([][]dest, len(targets))
	for i, t := range targets {
		if len(t.Hosts) > 0 && t.CircuitBreaker != nil && t.CircuitBreaker.Enabled {
			dests[i] = destinations(t)
		}
	}
	overlap := func(a, b []dest) bool {
		for _, x := range a {
			for _, y := range b {
				if x.host == y.host && (x.port == "" || y.port == "" || x.port == y.port) {
					return true
				}
			}
		}
		return false
	}
	leaders := make([]int, len(targets))
	for i := range leaders {
		leaders[i] = i
	}
	// Each target takes the least leader of those it overlaps, until
	// none changes: the first target of each group of sharers.
	for changed := true; changed; {
		changed = false
		for i := range targets {
			for j := range targets {
				if overlap(dests[i], dests[j]) && leaders[j] < leaders[i] {
					leaders[i], changed = leaders[j], true
				}
			}
		}
	}
	return leaders
}
