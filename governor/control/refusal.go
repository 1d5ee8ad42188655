package control

import (
	"strconv"

	"github.com/warden-dev/warden/internal/jsonstr"
)

// Header fields a refusal carries besides Header: Retry-After, and the
// RateLimit fields of the window that was counted
// (draft-ietf-httpapi-ratelimit-headers, as envoyproxy/ratelimit's optional
// response headers), spelt as SPEC §4 spells them.
const (
	HeaderRetryAfter = "Retry-After"
	HeaderLimit      = "RateLimit-Limit"
	HeaderRemaining  = "RateLimit-Remaining"
	HeaderReset      = "RateLimit-Reset"
)

// Refusal is what one refusal says, whatever protocol carries it. The HTTP
// listeners send it as headers and AppendBody's JSON body; the RLS as
// Envoy's response headers and local-reply body; the gRPC egress names
// Control in its trailers.
//
// The body's fields go out in one order, each only when set: control,
// quota (with limit), pool, target, host, current, error,
// retryAfterSeconds. That order is every body SPEC §4 and the listeners
// have ever written:
//
//	{"control":"tenant_rate","quota":"tenant:acme","limit":500,"current":501,"retryAfterSeconds":1}
//	{"control":"upstream","quota":"tenant:acme","limit":500,"retryAfterSeconds":1}
//	{"control":"circuit_breaker","target":"stripe","retryAfterSeconds":5}
//	{"control":"pool_queue","pool":"stripe","target":"stripe","retryAfterSeconds":1}
//	{"control":"upstream","target":"worker","error":"dial 127.0.0.1:9000: connection refused"}
//	{"control":"allow_unlisted","host":"example.com","error":"no target lists ..."}
type Refusal struct {
	Control Name
	// Quota names the refused quota ("tenant:acme", "rls:edge:tenant=acme");
	// Limit, its limit, goes with it.
	Quota  string
	Limit  int64
	Pool   string
	Target string
	Host   string
	// Current is the window's count with the refused request (which the
	// window itself never counts); 0 leaves it out: nothing was counted,
	// or the refuser does not say.
	Current int64
	Error   string
	// RetryAfter is the whole seconds of Retry-After and
	// retryAfterSeconds (RetryAfterSeconds); 0 leaves both out: waiting
	// does not help.
	RetryAfter int64
	// Counted says the refused window was counted, so the RateLimit
	// fields (Limit, Remaining, and RetryAfter as the reset) describe it.
	// A refusal made because a fail_closed backend was down counted
	// nothing and carries none.
	Counted   bool
	Remaining int64
}

// AppendBody appends r's JSON body to dst.
func (r *Refusal) AppendBody(dst []byte) []byte {
	dst = append(dst, `{"control":`...)
	dst = jsonstr.Append(dst, string(r.Control))
	if r.Quota != "" {
		dst = append(dst, `,"quota":`...)
		dst = jsonstr.Append(dst, r.Quota)
		dst = append(dst, `,"limit":`...)
		dst = strconv.AppendInt(dst, r.Limit, 10)
	}
	dst = appendString(dst, `,"pool":`, r.Pool)
	dst = appendString(dst, `,"target":`, r.Target)
	dst = appendString(dst, `,"host":`, r.Host)
	if r.Current > 0 {
		dst = append(dst, `,"current":`...)
		dst = strconv.AppendInt(dst, r.Current, 10)
	}
	dst = appendString(dst, `,"error":`, r.Error)
	if r.RetryAfter > 0 {
		dst = append(dst, `,"retryAfterSeconds":`...)
		dst = strconv.AppendInt(dst, r.RetryAfter, 10)
	}
	return append(dst, '}')
}

// appendString appends the member key (`,"name":`) with value v, unless v
// is empty.
func appendString(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return jsonstr.Append(append(dst, key...), v)
}
