package main

import "syscall"

// childAttr has the kernel kill a server this bench started if the bench
// itself dies first, so that no server outlives it.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
