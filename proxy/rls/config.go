package rls

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

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
// own window in the entry's scope, keyed by the value.
type limit struct {
	rate  int64
	scope *window.Scope
	quota string // "rls:domain:key=" prefix of the 429 body's quota field
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
		limited:  m.Rejections.WithLabelValues(ControlLimited, scope),
		upstr:    m.Rejections.WithLabelValues(ControlUpstream, scope),
	}
}

// unknownTarget labels requests for domains the policy does not name: the
// domain comes from the caller, and a label per arbitrary value would let
// callers grow the metric set without bound.
const unknownTarget = "unknown"

func compile(p *policy.RLS, m *metrics.Metrics) *config {
	c := &config{domains: make(map[string]*domain, len(p.Domains)), unknown: newDomainMetrics(m, unknownTarget)}
	scopes := map[[2]string]map[policy.Window]*window.Scope{}
	scope := func(dom, key string, w policy.Window) *window.Scope {
		k := [2]string{dom, key}
		if scopes[k] == nil {
			scopes[k] = map[policy.Window]*window.Scope{}
		}
		if s := scopes[k][w]; s != nil {
			return s
		}
		s := window.NewScope(scopeName(dom, key), w)
		scopes[k][w] = s
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
				l = &limit{rate: int64(e.Rate), scope: scope(name, e.Key, e.Window), quota: scopeName(name, e.Key) + "="}
				l.current = &rlspb.RateLimitResponse_RateLimit{Name: e.Key, RequestsPerUnit: uint32(e.Rate), Unit: unit(e.Window)}
				l.limitHeader = &corev3.HeaderValue{Key: HeaderLimit, Value: strconv.Itoa(e.Rate)}
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
