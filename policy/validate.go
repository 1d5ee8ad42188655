package policy

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/warden-dev/warden/internal/hostport"
)

// validate runs the checks that relate values to each other: conditional
// requirements, references, duplicates and listener clashes. Single-value
// rules were applied while decoding (see the check tags). It runs on the
// values as written, before defaults, so that "absent" can still be told
// apart from "zero".
func validate(p *Policy, d *decoder) {
	v := &validator{p: p, d: d}
	v.version()
	v.backend()
	if p.Ingress != nil {
		v.tenants("ingress", p.Ingress.Tenant, p.Ingress.Tenants)
	}
	v.egress()
	v.targets()
	v.pools()
	v.bridges()
	v.scheduler()
	v.rls()
	v.listeners()
}

type validator struct {
	p         *Policy
	d         *decoder
	poolIndex map[string]int // pool name → index in p.Pools, built by pool
}

// pool is the pool named name. The index is built on first use: a file
// can hold as many references as pools, and scanning the pools for each
// made 60,000 references to 30,000 pools take 15 s.
func (v *validator) pool(name string) (Pool, bool) {
	if v.poolIndex == nil {
		v.poolIndex = make(map[string]int, len(v.p.Pools))
		for i, pl := range v.p.Pools {
			v.poolIndex[pl.Name] = i
		}
	}
	i, ok := v.poolIndex[name]
	if !ok {
		return Pool{}, false
	}
	return v.p.Pools[i], true
}

// fail reports a problem with the value at path.
func (v *validator) fail(path, format string, args ...any) {
	v.d.markBad(path)
	v.d.found.add(v.d.at(path), path, format, args)
}

// failEntry reports a problem with the entry at path as a whole, at its key.
func (v *validator) failEntry(path, format string, args ...any) {
	v.d.found.add(v.d.keyAt(path), path, format, args)
}

func (v *validator) version() {
	if v.d.ok("version") && v.p.Version != 1 {
		v.fail("version", "%d is not supported; this warden reads version 1", v.p.Version)
	}
}

func (v *validator) backend() {
	b := v.p.Backend
	if b.Kind != "redis" {
		return
	}
	if !v.d.has("backend.url") {
		v.failEntry("backend", "kind redis needs url (e.g. redis://127.0.0.1:6379/0)")
		return
	}
	if v.d.ok("backend.url") {
		if err := checkRedisURL(b.URL); err != nil {
			v.fail("backend.url", "%v", err)
		}
	}
}

// tenants checks a listener's tenant overrides: they refine a default cap,
// and the default cap is what names the tenant header.
func (v *validator) tenants(section string, cap *TenantCap, overrides map[string]Limit) {
	if len(overrides) > 0 && cap == nil {
		v.failEntry(section+".tenants", "needs %s.tenant (the tenant header and the default cap the overrides refine)", section)
	}
}

func (v *validator) egress() {
	e := v.p.Egress
	if e == nil {
		return
	}
	if !v.d.has("egress.http_listen") && !v.d.has("egress.grpc_listen") {
		v.failEntry("egress", "needs http_listen, grpc_listen or both")
	}
	v.tenants("egress", e.Tenant, e.Tenants)
}

func (v *validator) targets() {
	// First users by index, not path: a file can hold 100,000 targets.
	names := make(map[string]int, len(v.p.Targets))          // target name → the first target with it
	hosts := make(map[string][2]int, hostCount(v.p.Targets)) // lower-cased host → the first target and host routing it
	services := map[string]int{}                             // gRPC service → the first target routing it
	namePath := func(i int) string { return v.d.item("targets", i) + ".name" }
	hostPath := func(ij [2]int) string { return index(v.d.item("targets", ij[0])+".hosts", ij[1]) }
	for i, t := range v.p.Targets {
		tp := v.d.item("targets", i)
		if v.d.okAt(tp, ".name") {
			if first, dup := names[t.Name]; dup {
				v.fail(tp+".name", "duplicate target name %q (first at line %d)", t.Name, v.d.line(namePath(first)))
			} else {
				names[t.Name] = i
			}
		}
		hasHosts, hasService := v.d.written(tp, ".hosts"), v.d.written(tp, ".grpc_service")
		switch {
		case hasHosts && hasService:
			v.failEntry(tp, "set hosts (an HTTP target) or grpc_service (a gRPC target), not both")
		case !hasHosts && !hasService:
			v.failEntry(tp, "needs hosts (an HTTP target) or grpc_service (a gRPC target)")
		}
		if v.d.okAt(tp, ".hosts") && len(t.Hosts) == 0 {
			v.fail(tp+".hosts", "lists no hosts")
		}
		for j, h := range t.Hosts {
			if !v.d.okItem(tp+".hosts", j) {
				continue
			}
			// Compared as the egress matches requests (case, a port's
			// leading zeros, IPv6 spelling); a host it cannot match is
			// reported by checkHost.
			key, err := hostport.Key(h)
			if err != nil {
				key = h
			}
			if first, dup := hosts[key]; dup {
				fp := hostPath(first)
				v.fail(hostPath([2]int{i, j}), "host %q is already routed by %s (line %d)", h, fp, v.d.line(fp))
				continue
			}
			hosts[key] = [2]int{i, j}
		}
		if v.d.okAt(tp, ".grpc_service") {
			if first, dup := services[t.GRPCService]; dup {
				fp := v.d.item("targets", first) + ".grpc_service"
				v.fail(tp+".grpc_service", "service %q is already routed by %s (line %d)", t.GRPCService, fp, v.d.line(fp))
			} else {
				services[t.GRPCService] = i
			}
		}
		if v.d.okAt(tp, ".upstream") {
			schemes := []string{"http", "https"}
			if hasService && !hasHosts {
				schemes = []string{"h2c", "http", "https"}
			}
			if err := checkURL(t.Upstream, schemes, false); err != nil {
				v.fail(tp+".upstream", "%v", err)
			}
		}
		if len(t.Pools) > 0 {
			v.poolRefs(tp+".pools", t.Pools)
		}
	}
}

func hostCount(ts []Target) int {
	n := 0
	for _, t := range ts {
		n += len(t.Hosts)
	}
	return n
}

// poolRefs checks a list of pool names. Listing a pool twice, or two
// pools sharing a cap_key (which are one pool), would make a request take
// two slots of it.
func (v *validator) poolRefs(path string, refs []string) {
	seen := make(map[string]string, len(refs)) // pool ID → the name that listed it
	for j, name := range refs {
		if !v.d.okItem(path, j) {
			continue
		}
		rp := index(path, j)
		if _, dup := seen[name]; dup {
			v.fail(rp, "pool %q is listed twice", name)
			continue
		}
		id := name
		if pl, ok := v.pool(name); ok {
			id = pl.ID()
		}
		if first, dup := seen[id]; dup {
			v.fail(rp, "pools %q and %q share cap_key %q, so they are one pool: list one of them", first, name, strings.TrimPrefix(id, "cap:"))
			continue
		}
		seen[name], seen[id] = name, name
		v.poolRef(rp, name)
	}
}

func (v *validator) poolRef(path, name string) {
	if _, ok := v.pool(name); ok || v.d.has(child("pools", name)) {
		return // defined, or written with a value already reported
	}
	v.fail(path, "undefined pool %q%s", name, suggestion{name, func() []string {
		names := make([]string, len(v.p.Pools))
		for i, pl := range v.p.Pools {
			names[i] = pl.Name
		}
		return names
	}})
}

func (v *validator) pools() {
	for _, pl := range v.p.Pools {
		pp := child("pools", pl.Name)
		if err := checkName(pl.Name); err != nil {
			v.failEntry(pp, "%v", err)
		}
		if pl.Rate > 0 && !v.d.has(pp+".window") {
			v.failEntry(pp, "rate %d needs a window (1, 60, 3600 or 86400 seconds)", pl.Rate)
		}
	}
}

func (v *validator) bridges() {
	names := make(map[string]int, len(v.p.Bridges)) // bridge name → the first bridge with it
	for i, b := range v.p.Bridges {
		bp := v.d.item("bridges", i)
		if v.d.okAt(bp, ".name") {
			if first, dup := names[b.Name]; dup {
				v.fail(bp+".name", "duplicate bridge name %q (first at line %d)", b.Name, v.d.line(v.d.item("bridges", first)+".name"))
			} else {
				names[b.Name] = i
			}
		}
		// Only the postgres protocol can see transactions; on a tcp bridge
		// the setting would silently do nothing.
		if v.d.written(bp, ".idle_in_transaction_timeout") && b.Protocol != ProtocolPostgres && !v.d.isBad(bp+".protocol") {
			v.fail(bp+".idle_in_transaction_timeout", "needs protocol: postgres (a %s bridge cannot see transactions)", orDefault(b.Protocol, ProtocolTCP))
		}
	}
}

func (v *validator) scheduler() {
	s := v.p.Scheduler
	if s == nil {
		return
	}
	if v.p.Ingress == nil {
		v.failEntry("scheduler", "needs the ingress section: runs are accepted on ingress.listen and delivered to ingress.worker")
	}
	if v.d.ok("scheduler.path_prefix") && len(s.PathPrefix) > 1 && strings.HasSuffix(s.PathPrefix, "/") {
		v.fail("scheduler.path_prefix", "%q must not end with '/'", s.PathPrefix)
	}
	if s.Store.Kind == "postgres" {
		if !v.d.has("scheduler.store.url") {
			v.failEntry("scheduler.store", "kind postgres needs url (e.g. postgres://warden@127.0.0.1:5432/warden)")
		} else if v.d.ok("scheduler.store.url") {
			if err := checkPostgresURL(s.Store.URL); err != nil {
				v.fail("scheduler.store.url", "%v", err)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Semaphores)) {
		if err := checkName(name); err != nil {
			v.failEntry(child("scheduler.semaphores", name), "%v", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Definitions)) {
		v.definition(child("scheduler.definitions", name), s.Definitions[name])
	}
}

func (v *validator) definition(dp string, def Definition) {
	if err := checkName(def.Name); err != nil {
		v.failEntry(dp, "%v", err)
	}
	if v.d.ok(dp + ".key") {
		if err := checkKeyExpr(def.Key); err != nil {
			v.fail(dp+".key", "%v", err)
		}
	}
	if def.KeyConcurrency > 0 && !v.d.has(dp+".key") {
		v.fail(dp+".key_concurrency", "needs key (the expression that groups runs, e.g. ${input.tenantId})")
	}
	if v.d.ok(dp + ".pool") {
		v.poolRef(dp+".pool", def.Pool)
	}
	seen := map[string]bool{}
	for j, name := range def.Semaphores {
		sp := index(dp+".semaphores", j)
		if !v.d.ok(sp) {
			continue
		}
		switch _, defined := v.p.Scheduler.Semaphores[name]; {
		case seen[name]:
			v.fail(sp, "semaphore %q is listed twice", name)
		case !defined:
			v.fail(sp, "undefined semaphore %q%s; define it under scheduler.semaphores", name,
				suggestion{name, func() []string { return slices.Sorted(maps.Keys(v.p.Scheduler.Semaphores)) }})
		}
		seen[name] = true
	}
}

// checkKeyExpr checks a definition key: text with at least one
// ${input.<path>} or ${header.<name>} placeholder.
func checkKeyExpr(s string) error {
	n := 0
	for rest := s; ; {
		i := strings.Index(rest, "${")
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return fmt.Errorf("%q has an unterminated ${", s)
		}
		expr := rest[i+2 : i+j]
		src, arg, _ := strings.Cut(expr, ".")
		switch {
		case src == "input" && inputPathRE.MatchString(arg):
		case src == "header" && headerRE.MatchString(arg):
		default:
			return fmt.Errorf("placeholder ${%s} must be ${input.<path>} or ${header.<name>}", expr)
		}
		n++
		rest = rest[i+j+1:]
	}
	if n == 0 {
		return fmt.Errorf("%q has no ${input.<path>} or ${header.<name>} placeholder, so every run would share one key", s)
	}
	return nil
}

func (v *validator) rls() {
	r := v.p.RLS
	if r == nil {
		return
	}
	for _, domain := range slices.Sorted(maps.Keys(r.Domains)) {
		dp := child("rls.domains", domain)
		seen := make(map[[2]string]int, len(r.Domains[domain])) // key and value → the first entry with them
		for j, e := range r.Domains[domain] {
			ep := v.d.item(dp, j)
			if !v.d.okAt(ep, ".key") || v.d.joined([]string{ep, ".value"}).bad {
				continue
			}
			k := [2]string{e.Key, e.Value}
			if first, dup := seen[k]; dup {
				v.failEntry(ep, "duplicate entry for key %q value %q (first at line %d)", e.Key, e.Value, v.d.line(v.d.item(dp, first)))
				continue
			}
			seen[k] = j
		}
	}
}

// listeners reports two listeners on one address. A wildcard host (empty,
// 0.0.0.0, ::) clashes with every host on the same port, as bind(2) does.
// Port 0 asks the kernel for a free port and never clashes.
func (v *validator) listeners() {
	type listener struct {
		path, addr, host string
		port             int
		pos              Position
	}
	var ls []listener
	add := func(path, addr string) {
		if !v.d.ok(path) {
			return
		}
		host, port, err := checkListen(addr)
		if err != nil || port == 0 {
			return
		}
		ls = append(ls, listener{path, addr, strings.ToLower(host), port, v.d.at(path)})
	}
	if v.p.Admin != nil {
		add("admin.listen", v.p.Admin.Listen)
	}
	if v.p.Ingress != nil {
		add("ingress.listen", v.p.Ingress.Listen)
	}
	if v.p.Egress != nil {
		add("egress.http_listen", v.p.Egress.HTTPListen)
		add("egress.grpc_listen", v.p.Egress.GRPCListen)
	}
	for i, b := range v.p.Bridges {
		add(v.d.item("bridges", i)+".listen", b.Listen)
	}
	if v.p.RLS != nil {
		add("rls.listen", v.p.RLS.Listen)
	}
	sort.SliceStable(ls, func(i, j int) bool {
		if ls[i].pos.Line != ls[j].pos.Line {
			return ls[i].pos.Line < ls[j].pos.Line
		}
		return ls[i].pos.Column < ls[j].pos.Column
	})
	// A listener clashes with the first earlier one on its port with the
	// same host or a wildcard on either side. Indexed by port, so that
	// 60,000 bridges are not compared in pairs.
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	type port struct {
		first, wildcard int            // earliest listener on it, earliest wildcard; -1 for none
		byHost          map[string]int // earliest per host
	}
	ports := map[int]*port{}
	for i, l := range ls {
		pt := ports[l.port]
		if pt == nil {
			pt = &port{first: i, wildcard: -1, byHost: map[string]int{}}
			ports[l.port] = pt
		}
		clash := -1
		if wildcard(l.host) {
			clash = pt.first
		} else if j, ok := pt.byHost[l.host]; ok {
			clash = j
		}
		if pt.wildcard >= 0 && (clash < 0 || pt.wildcard < clash) {
			clash = pt.wildcard
		}
		if clash >= 0 && clash < i {
			e := ls[clash]
			v.fail(l.path, "%s is already used by %s (%s, line %d)", l.addr, e.path, e.addr, e.pos.Line)
		}
		if _, ok := pt.byHost[l.host]; !ok {
			pt.byHost[l.host] = i
		}
		if wildcard(l.host) && pt.wildcard < 0 {
			pt.wildcard = i
		}
	}
}

// validateEffective checks orderings that only make sense once defaults are
// merged (a target's delay against a max_delay from egress.defaults). Each
// problem is reported once, at the most specific level that wrote one of
// the pair; a level that wrote neither inherited the problem and the level
// it inherited from reports it.
//
// It works out the merged values itself rather than reading what
// applyDefaults fills in, which only a policy that validated gets.
func validateEffective(p *Policy, d *decoder) {
	v := &validator{p: p, d: d}
	const dr, db = "egress.defaults.retry", "egress.defaults.circuit_breaker"
	eff := targetDefaults(p, d)
	if p.Egress != nil {
		v.ordered([]string{dr}, eff.Retry, []string{db}, eff.CircuitBreaker)
	}
	rLevels, bLevels := []string{"", dr}, []string{"", db}
	for i := range p.Targets {
		tp := d.item("targets", i)
		b, r := targetEffective(d, &p.Targets[i], tp, eff)
		rLevels[0], bLevels[0] = tp+".retry", tp+".circuit_breaker"
		v.ordered(rLevels, &r, bLevels, &b)
	}
	if p.Scheduler != nil {
		for name, def := range p.Scheduler.Definitions {
			r := definitionRetry(d, name, def)
			v.ordered([]string{child(child("scheduler.definitions", name), "retry")}, &r, nil, nil)
		}
	}
}

// ordered checks delay <= max_delay and open <= max_open. levels are the
// paths the values were merged from, most specific first.
func (v *validator) ordered(rLevels []string, r *Retry, bLevels []string, b *CircuitBreaker) {
	if r != nil && r.MaxDelay < r.Delay && !v.anyBad(rLevels, "delay", "max_delay") {
		rp := rLevels[0]
		switch {
		case v.d.has(rp + ".max_delay"):
			v.fail(rp+".max_delay", "%s is less than delay %s", r.MaxDelay, r.Delay)
		case v.d.has(rp + ".delay"):
			v.fail(rp+".delay", "%s is more than max_delay %s", r.Delay, r.MaxDelay)
		}
	}
	if b != nil && b.MaxOpen < b.Open && !v.anyBad(bLevels, "open", "max_open") {
		bp := bLevels[0]
		switch {
		case v.d.has(bp + ".max_open"):
			v.fail(bp+".max_open", "%s is less than open %s", b.MaxOpen, b.Open)
		case v.d.has(bp + ".open"):
			v.fail(bp+".open", "%s is more than max_open %s", b.Open, b.MaxOpen)
		}
	}
}

// anyBad reports whether any of keys under any level was already reported
// as wrong; its zero value would only produce a second, misleading error.
func (v *validator) anyBad(levels []string, keys ...string) bool {
	for _, l := range levels {
		for _, k := range keys {
			if v.d.isBad(l + "." + k) {
				return true
			}
		}
	}
	return false
}

var inputPathRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

func orDefault(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}
