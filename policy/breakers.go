package policy

import (
	"net"
	"net/url"
	"strings"
)

// breakerLeaders says which target's breaker each target uses: SPEC §4 has
// HTTP targets that send to the same host share one breaker, since a host
// that is failing fails for every target that reaches it. leaders[i] is the
// index of the first target, in file order, whose breaker target i shares;
// i itself when it shares with none. Only HTTP targets with their breaker
// enabled share: a disabled breaker has nothing to share, and gRPC targets
// are told apart by service, not host.
//
// A target sends to its upstream's host:port when it has an upstream, else
// to the hosts it lists; a listed host without a port stands for every port
// of that host. Sharing is transitive.
//
// Targets are joined host by host, never pair by pair: a file of 100,000
// targets compared in pairs took a minute to validate.
func breakerLeaders(targets []Target) []int {
	leaders := make([]int, len(targets))
	for i := range leaders {
		leaders[i] = i
	}
	find := func(i int) int {
		for leaders[i] != i {
			leaders[i] = leaders[leaders[i]]
			i = leaders[i]
		}
		return i
	}
	join := func(i, j int) {
		a, b := find(i), find(j)
		// The earlier target leads, so the leader is the same whatever
		// order the targets are joined in.
		leaders[max(a, b)] = min(a, b)
	}
	// Per host: the first target sending to each of its ports, and the
	// first sending to every port. That one joins every target of the
	// host; until it exists, only those sending to one port are joined.
	type hostTargets struct {
		byPort   map[string]int
		anyPort  int
		everyone bool
	}
	hosts := map[string]*hostTargets{}
	for i, t := range targets {
		if len(t.Hosts) == 0 || t.CircuitBreaker == nil || !t.CircuitBreaker.Enabled {
			continue
		}
		for _, d := range destinations(t) {
			h := hosts[d.host]
			if h == nil {
				h = &hostTargets{byPort: map[string]int{}}
				hosts[d.host] = h
			}
			switch {
			case h.everyone:
				join(i, h.anyPort)
			case d.port == "":
				for _, j := range h.byPort {
					join(i, j)
				}
				h.anyPort, h.everyone, h.byPort = i, true, nil
			default:
				if j, ok := h.byPort[d.port]; ok {
					join(i, j)
				} else {
					h.byPort[d.port] = i
				}
			}
		}
	}
	for i := range leaders {
		leaders[i] = find(i)
	}
	return leaders
}

// dest is a host a target sends to; port "" is any port.
type dest struct{ host, port string }

func destinations(t Target) []dest {
	if t.Upstream != "" {
		u, err := url.Parse(t.Upstream)
		if err != nil || u.Host == "" {
			return nil
		}
		port := u.Port()
		if port == "" {
			port = "80"
			if u.Scheme == "https" {
				port = "443"
			}
		}
		return []dest{{strings.ToLower(u.Hostname()), port}}
	}
	out := make([]dest, 0, len(t.Hosts))
	for _, h := range t.Hosts {
		h = strings.ToLower(h)
		if host, port, err := net.SplitHostPort(h); err == nil {
			out = append(out, dest{host, port})
		} else {
			out = append(out, dest{strings.Trim(h, "[]"), ""})
		}
	}
	return out
}

// breakerWarnings reports targets that share a breaker with an earlier one
// but ask for other breaker settings. As with cap_key pools this is a
// warning, never an error: the first target's settings are the ones in
// force, and only the operator knows which were meant.
func breakerWarnings(p *Policy, w *firstIssues) {
	for i, l := range p.leaders {
		if l == i {
			continue
		}
		a, b := p.Targets[l], p.Targets[i]
		if diffs := breakerDiffs(*a.CircuitBreaker, *b.CircuitBreaker); len(diffs) > 0 {
			w.add(b.Pos, "",
				"target %q sends to a host that target %q (line %d) also sends to, so they share one circuit breaker, but their breaker settings differ (%s); the first target's are used",
				[]any{b.Name, a.Name, a.Pos.Line, diffs})
		}
	}
}

func breakerDiffs(a, b CircuitBreaker) settingDiffs {
	var d settingDiffs
	d.add("failure_ratio", a.FailureRatio, b.FailureRatio)
	d.add("minimum_requests", a.MinimumRequests, b.MinimumRequests)
	d.add("window", a.Window, b.Window)
	d.add("open", a.Open, b.Open)
	d.add("max_open", a.MaxOpen, b.MaxOpen)
	return d
}
