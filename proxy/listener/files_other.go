//go:build !unix

package listener

// FileLimit is 0 (unknown) where there is no RLIMIT_NOFILE.
func FileLimit() uint64 { return 0 }
