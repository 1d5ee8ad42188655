package store

import (
	"crypto/rand"
	"encoding/hex"
)

// IDScoper is implemented by stores whose sequence numbers belong to them
// alone. Two standalone sidecars, or one whose store file was deleted,
// both count from 1, so a sequence number by itself would hand a worker
// the same run id for different runs, and a worker that is idempotent per
// run id (as workers are told to be) would skip the second. IDScope names
// the store's numbering: a random token made when the store is created
// and kept with it, which the scheduler puts in front of the sequence in
// public run ids. A store shared by every sidecar (Postgres) numbers runs
// once for all and does not implement it.
type IDScoper interface {
	IDScope() string
}

// newScope returns 48 random bits in hex: among a fleet of a thousand
// standalone sidecars, two share a scope with a probability of about 2e-9.
func newScope() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand aborts the program instead
	return hex.EncodeToString(b[:])
}
