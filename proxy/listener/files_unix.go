//go:build unix

package listener

import "syscall"

// FileLimit is the process's soft RLIMIT_NOFILE; 0 when it cannot be read.
func FileLimit() uint64 {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) != nil {
		return 0
	}
	return uint64(r.Cur)
}
