//go:build !linux

package main

import (
	"fmt"
	"os"
)

// The relay is built on epoll; elsewhere the harness leaves its row out.
func serveRelay(listen, upstream string) {
	fmt.Fprintln(os.Stderr, "relay: needs Linux (epoll)")
	os.Exit(1)
}
