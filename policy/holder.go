package policy

import "sync/atomic"

// Holder is the running policy. Readers call Load on every use and never
// keep the result across requests, so a reload takes effect at the next
// request without locks; a *Policy is immutable, so a reader still holding
// the old one is safe.
type Holder struct {
	cur atomic.Pointer[Policy]
}

// NewHolder returns a Holder serving p.
func NewHolder(p *Policy) *Holder {
	h := &Holder{}
	h.cur.Store(p)
	return h
}

// Load returns the current policy.
func (h *Holder) Load() *Policy { return h.cur.Load() }

// Swap makes p current and returns the policy it replaced.
func (h *Holder) Swap(p *Policy) *Policy { return h.cur.Swap(p) }
