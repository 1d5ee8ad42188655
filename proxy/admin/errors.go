package admin

// PartialApplyError is what a Reload source returns when it put the
// reloaded policy in force but some components could not take it and kept
// their previous settings (a listener whose new address is taken, say). It
// is how POST /v1/policy/reload tells "applied, with errors" (200) from
// "rejected, nothing changed" (422).
type PartialApplyError struct {
	Err error // the components' errors, joined
}

func (e *PartialApplyError) Error() string { return e.Err.Error() }

func (e *PartialApplyError) Unwrap() error { return e.Err }
