package control

import "testing"

// TestAppendBody: every refusal body the listeners send, byte for byte
// (SPEC §4's examples among them).
func TestAppendBody(t *testing.T) {
	for _, tc := range []struct {
		r    Refusal
		want string
	}{
		{Refusal{Control: TenantRate, Quota: "tenant:acme", Limit: 500, Current: 501, RetryAfter: 1, Counted: true},
			`{"control":"tenant_rate","quota":"tenant:acme","limit":500,"current":501,"retryAfterSeconds":1}`},
		{Refusal{Control: Upstream, Quota: "tenant:acme", Limit: 500, RetryAfter: 1},
			`{"control":"upstream","quota":"tenant:acme","limit":500,"retryAfterSeconds":1}`},
		{Refusal{Control: CircuitBreaker, Target: "stripe", RetryAfter: 5},
			`{"control":"circuit_breaker","target":"stripe","retryAfterSeconds":5}`},
		{Refusal{Control: PoolQueue, Pool: "stripe", Target: "stripe", RetryAfter: 1},
			`{"control":"pool_queue","pool":"stripe","target":"stripe","retryAfterSeconds":1}`},
		{Refusal{Control: Upstream, Target: "worker", Error: "dial 127.0.0.1:9000: connection refused"},
			`{"control":"upstream","target":"worker","error":"dial 127.0.0.1:9000: connection refused"}`},
		{Refusal{Control: AllowUnlisted, Host: "a\"b", Error: "no"},
			`{"control":"allow_unlisted","host":"a\"b","error":"no"}`},
	} {
		if got := string(tc.r.AppendBody(nil)); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}

// TestAppendBodyAllocates nothing into a buffer with room: the listeners
// write refusals on their hot path.
func TestAppendBodyAllocatesNothing(t *testing.T) {
	r := Refusal{Control: TenantRate, Quota: "tenant:acme", Limit: 500, Current: 501, RetryAfter: 1}
	var buf [160]byte
	if n := testing.AllocsPerRun(100, func() { _ = r.AppendBody(buf[:0]) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
