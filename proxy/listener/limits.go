package listener

import (
	"fmt"
	"math"

	"github.com/warden-dev/warden/policy"
)

// Limits are what a listener allows its clients: how many connections it
// holds at once, and how long a slow one may hold one.
type Limits struct {
	MaxConns int // 0: no cap
	// Timeouts of the connections accepted under these limits; a zero
	// duration bounds nothing.
	Timeouts policy.ListenerTimeouts
}

// The listener limits rule (policy/REFERENCE.md, "listener limits").
const (
	// reservedFiles are kept for the process itself: the run store, log
	// files, the admin and rls listeners, the backend's connections.
	reservedFiles = 256
	// maxDefaultConns bounds a derived cap: past it a file limit is no
	// longer the constraint, memory is.
	maxDefaultConns = 16384
)

// NewLimits are the limits of a data listener whose policy section sets
// maxConns (0: derived from nofile, the process's file limit, for p) and
// timeouts t.
func NewLimits(maxConns int, t policy.ListenerTimeouts, p *policy.Policy, nofile uint64) Limits {
	if maxConns == 0 {
		maxConns = DefaultMaxConns(p, nofile)
	}
	return Limits{MaxConns: maxConns, Timeouts: t}
}

// DefaultMaxConns is the cap of a data listener whose policy leaves
// max_connections out: of the file limit nofile, reserveFor(p) is kept,
// and half of the rest goes to client connections (the other half to the
// upstream connection each may need), shared equally by the data
// listeners p configures, at most maxDefaultConns each and at least one.
// An unknown limit (0) or none (RLIM_INFINITY) gives maxDefaultConns.
func DefaultMaxConns(p *policy.Policy, nofile uint64) int {
	if nofile == 0 || nofile > math.MaxInt32 {
		return maxDefaultConns
	}
	n := max(dataListeners(p), 1)
	share := (int64(nofile) - reserveFor(p)) / 2 / int64(n)
	return int(min(max(share, 1), maxDefaultConns))
}

// reserveFor is what the rule keeps out of client connections' reach:
// reservedFiles, and each bridge's two descriptors (client and upstream)
// per connection it may hold.
func reserveFor(p *policy.Policy) int64 {
	r := int64(reservedFiles)
	for _, b := range p.Bridges {
		r += 2 * int64(b.MaxConnections)
	}
	return r
}

// dataListeners counts the ingress, HTTP egress and gRPC egress listeners
// p configures.
func dataListeners(p *policy.Policy) int {
	n := 0
	if p.Ingress != nil {
		n++
	}
	if e := p.Egress; e != nil {
		if e.HTTPListen != "" {
			n++
		}
		if e.GRPCListen != "" {
			n++
		}
	}
	return n
}

// BudgetWarning says how p's connection caps overdraw the file limit
// nofile: the data listeners' clients, with an upstream connection each,
// would leave fewer descriptors than the rule's reserve. "" when they fit
// or the limit is unknown.
func BudgetWarning(p *policy.Policy, nofile uint64) string {
	if nofile == 0 || nofile > math.MaxInt32 {
		return ""
	}
	var caps int64
	if in := p.Ingress; in != nil {
		caps += int64(NewLimits(in.MaxConnections, in.Timeouts, p, nofile).MaxConns)
	}
	if e := p.Egress; e != nil {
		per := int64(NewLimits(e.MaxConnections, e.Timeouts, p, nofile).MaxConns)
		if e.HTTPListen != "" {
			caps += per
		}
		if e.GRPCListen != "" {
			caps += per
		}
	}
	reserve := reserveFor(p)
	if left := int64(nofile) - 2*caps; left < reserve {
		return fmt.Sprintf("the data listeners may hold %d client connections, with their upstream connections %d descriptors, "+
			"which leaves %d of the file limit %d: fewer than the %d kept for bridges and the process itself; "+
			"lower ingress/egress max_connections or raise the limit (ulimit -n)", caps, 2*caps, left, nofile, reserve)
	}
	return ""
}
