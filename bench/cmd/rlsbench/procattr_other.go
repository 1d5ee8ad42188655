//go:build !linux

package main

import "syscall"

// childAttr: only Linux has a parent-death signal; elsewhere the deferred
// stop is all there is.
func childAttr() *syscall.SysProcAttr { return nil }
