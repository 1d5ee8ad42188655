package policy

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// warn fills p.Warnings with p's non-fatal findings in file order, at most
// MaxErrors of them, and counts the others in p.MoreWarnings: like errors,
// a file can hold as many as it has pools or targets.
func warn(p *Policy, d *decoder) {
	var w firstIssues
	capKeyWarnings(p, &w)
	breakerWarnings(p, &w)
	adminWarning(p, d, &w)
	p.Warnings, p.MoreWarnings = w.kept, w.more
}

// capKeyWarnings reports pools that share a cap_key with an earlier one
// but disagree with the first member on the settings the shared counter
// and concurrency limit are built from: the first member's are the ones in
// force. SPEC §4 makes this a warning, never an error: the pools still
// share one counter, and only the operator knows which settings were
// meant. Each member is compared with the first only, so that a cap_key
// of n members gives at most n-1 warnings, not one per pair.
func capKeyWarnings(p *Policy, w *firstIssues) {
	first := map[string]Pool{} // cap_key → its first member, in file order
	for _, b := range p.Pools {
		if b.CapKey == "" {
			continue
		}
		a, seen := first[b.CapKey]
		if !seen {
			first[b.CapKey] = b
			continue
		}
		var d settingDiffs
		d.add("concurrency", a.Concurrency, b.Concurrency)
		d.add("rate", a.Rate, b.Rate)
		d.add("window", int(a.Window), int(b.Window))
		d.add("queue", a.Queue, b.Queue)
		if len(d) == 0 {
			continue
		}
		w.add(b.Pos, child("pools", b.Name),
			"shares cap_key %q with %s (line %d) but their settings differ (%s); members of a cap_key share one counter and one concurrency limit, with the first member's settings",
			[]any{b.CapKey, child("pools", a.Name), a.Pos.Line, d})
	}
}

// adminWarning reports an admin listener that hosts other than this one
// can reach while no token is configured: every admin GET answers without
// one (tenants, queues, metrics, the policy), and nothing on the listener
// says the exposure was meant. The token is read from the environment
// Parse runs in, so a CI job that validates without the secret sees the
// warning; the message says so.
func adminWarning(p *Policy, d *decoder, w *firstIssues) {
	if p.Admin == nil || loopbackOnly(p.Admin.Listen) || strings.TrimSpace(os.Getenv(p.Admin.TokenEnv)) != "" {
		return
	}
	w.add(d.at("admin.listen"), "admin.listen",
		"%s is not a loopback address and no admin token is configured (%s is unset or blank where this policy was checked): every admin GET (tenants, queues, metrics, policy) answers anyone who can reach it, unauthenticated; listen on 127.0.0.1 unless that is meant",
		[]any{p.Admin.Listen, p.Admin.TokenEnv})
}

// loopbackOnly reports whether a listen address accepts connections from
// this host only: localhost or a loopback IP. An empty host, 0.0.0.0 and
// [::] are every interface; any other name may resolve anywhere.
func loopbackOnly(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// settingDiffs lists the settings two members of a shared control
// disagree on, as "name x vs y".
type settingDiffs []string

func (d *settingDiffs) add(name string, x, y any) {
	if x != y {
		*d = append(*d, fmt.Sprintf("%s %v vs %v", name, x, y))
	}
}

func (d settingDiffs) String() string { return strings.Join(d, ", ") }
