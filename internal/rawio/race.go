//go:build race

package rawio

import (
	"runtime"
	"unsafe"
)

// The race detector does not see what a system call reads or writes in
// memory; the syscall package tells it, and so must raw calls, or a buffer
// reused while a read fills it would go unnoticed under -race.

func raceRead(p []byte) {
	if len(p) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p))
	}
}

func raceWrite(p []byte) {
	if len(p) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), len(p))
	}
}
