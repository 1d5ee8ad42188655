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

// Reload loads the policy file at path and, only if it is valid, makes it
// current. On error the running policy stays (SPEC §3) and is returned with
// the error, which is a policy.Errors for an invalid file. A file whose
// bytes have not changed keeps the running policy as is, so a watcher that
// fires on every write does not churn LoadedAt or consumers' state.
func (h *Holder) Reload(path string) (*Policy, error) {
	p, err := Load(path)
	if err != nil {
		return h.Load(), err
	}
	if cur := h.Load(); cur != nil && cur.Hash == p.Hash && cur.Source == p.Source {
		return cur, nil
	}
	h.Swap(p)
	return p, nil
}
