package rls

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// config is rls.domains compiled for lookups: domain → descriptor key →
// the key-only limit and the per-value overrides. It is immutable and
// swapped whole on reload.
type config struct {
	domains map[string]*domain
	unknown *domainMetrics // requests naming a domain that is not configured
}

type domain struct {
	name string
	keys map[string]*keyLimits
	m    *domainMetrics
}

type keyLimits struct {
	def    *limit            // key-only entry; nil when the key has only value entries
	values map[string]*limit // value entries, overriding def for their value
	// A nil limit (def, or a value's) is an entry with rate 0: the gate is
	// off (SPEC §4), and a value's nil still overrides def.
}

// limit is one entry of a domain. Every value of a descriptor key gets its
// own window in the entry's scope, keyed by the value. A key-only entry's
// values are the client's to choose, so its scope holds at most MaxKeys of
// them per window; the values beyond share its overflow window.
type limit struct {
	rate     int64
	scope    *window.Scope
	quota    string // "rls:domain:key=" prefix of the 429 body's quota field
	overflow *limit // key-only entries: the window of values beyond MaxKeys
	// Shared by every response of this limit: gRPC only reads (marshals)
	// them, so one immutable message per limit saves an allocation a call.
	current     *rlspb.RateLimitResponse_RateLimit // name "key" or "key=value"
	limitHeader *corev3.HeaderValue
}

// domainMetrics are one domain's pre-resolved metric children, so a call
// costs no label lookups.
type domainMetrics struct {
	ok, over       prometheus.Counter
	duration       prometheus.Observer
	limited, upstr prometheus.Counter
	overflow       prometheus.Counter // warden_tenant_overflow_total{listener="rls"}
}

func newDomainMetrics(m *metrics.Metrics, target string) *domainMetrics {
	if m == nil {
		return nil
	}
	scope := "rls:" + target
	return &domainMetrics{
		ok:       m.Requests.WithLabelValues(listenerLabel, target, rlspb.RateLimitResponse_OK.String()),
		over:     m.Requests.WithLabelValues(listenerLabel, target, rlspb.RateLimitResponse_OVER_LIMIT.String()),
		duration: m.RequestDuration.WithLabelValues(listenerLabel, target),
		limited:  m.Rejections.WithLabelValues(string(control.TenantRate), scope),
		upstr:    m.Rejections.WithLabelValues(string(control.Upstream), scope),
		overflow: m.TenantOverflow.WithLabelValues(listenerLabel),
	}
}

// MaxKeys is how many values of one key-only entry a window counts apart
// (a fixed cap, not a policy key: the tenant caps' max_keys default).
const MaxKeys = 100_000

// unknownTarget labels requests for domains the policy does not name: the
// domain comes from the caller, and a label per arbitrary value would let
// callers grow the metric set without bound.
const unknownTarget = "unknown"

// compile builds the lookups of p, with maxKeys values counted apart per
// key-only entry and window (MaxKeys in production).
func compile(p *policy.RLS, m *metrics.Metrics, maxKeys int) *config {
	c := &config{domains: make(map[string]*domain, len(p.Domains)), unknown: newDomainMetrics(m, unknownTarget)}
	scopes := map[string]map[policy.Window]*window.Scope{}
	scope := func(name string, w policy.Window, maxKeys int) *window.Scope {
		if scopes[name] == nil {
			scopes[name] = map[policy.Window]*window.Scope{}
		}
		if s := scopes[name][w]; s != nil {
			return s
		}
		s := window.NewScope(name, w)
		s.MaxKeys = maxKeys
		scopes[name][w] = s
		return s
	}
	for name, entries := range p.Domains {
		d := &domain{name: name, keys: map[string]*keyLimits{}, m: newDomainMetrics(m, name)}
		for _, e := range entries {
			kl := d.keys[e.Key]
			if kl == nil {
				kl = &keyLimits{values: map[string]*limit{}}
				d.keys[e.Key] = kl
			}
			var l *limit
			if e.Rate > 0 {
				sn := scopeName(name, e.Key)
				l = &limit{rate: int64(e.Rate), quota: sn + "="}
				l.current = &rlspb.RateLimitResponse_RateLimit{Name: e.Key, RequestsPerUnit: uint32(e.Rate), Unit: unit(e.Window)}
				l.limitHeader = &corev3.HeaderValue{Key: control.HeaderLimit, Value: strconv.Itoa(e.Rate)}
				if e.Value != "" {
					// The policy names these values: counted apart
					// from the clients' (no "=" ends a key-only
					// entry's scope name: it is escaped there).
					l.scope = scope(sn+"=", e.Window, 0)
				} else {
					l.scope = scope(sn, e.Window, maxKeys)
					o := overflowName(name, e.Key)
					l.overflow = &limit{rate: l.rate, scope: scope(o, e.Window, 0), quota: o,
						current: l.current, limitHeader: l.limitHeader}
				}
			}
			if e.Value != "" {
				if l != nil {
					l.current.Name = e.Key + "=" + e.Value
				}
				kl.values[e.Value] = l
			} else {
				kl.def = l
			}
		}
		c.domains[name] = d
	}
	return c
}

// scopeName names the windows of a domain's key: "rls:edge:tenant". A
// domain or key may hold the separators, so they are percent-escaped in
// both: domain "x" key "y:z" and domain "x:y" key "z" must not share a
// count, nor key "k=v" value "w" and key "k" value "v=w" a quota name.
func scopeName(domain, key string) string {
	return "rls:" + nameEscaper.Replace(domain) + ":" + nameEscaper.Replace(key)
}

// overflowName names the overflow window of a domain's key-only entry, in
// its scope and as the quota of its 429s: "rls_overflow:edge:tenant".
func overflowName(domain, key string) string {
	return "rls_overflow:" + nameEscaper.Replace(domain) + ":" + nameEscaper.Replace(key)
}

var nameEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "=", "%3D")

// match returns the limit of a descriptor entry: the entry for its value if
// there is one, else the key's; nil when the key is not limited or the
// entry that applies has rate 0.
func (d *domain) match(key, value string) *limit {
	kl := d.keys[key]
	if kl == nil {
		return nil
	}
	if l, ok := kl.values[value]; ok {
		return l
	}
	return kl.def
}

func unit(w policy.Window) rlspb.RateLimitResponse_RateLimit_Unit {
	switch w {
	case policy.WindowSecond:
		return rlspb.RateLimitResponse_RateLimit_SECOND
	case policy.WindowMinute:
		return rlspb.RateLimitResponse_RateLimit_MINUTE
	case policy.WindowHour:
		return rlspb.RateLimitResponse_RateLimit_HOUR
	default:
		return rlspb.RateLimitResponse_RateLimit_DAY
	}
}
