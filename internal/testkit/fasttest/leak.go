// Package fasttest holds test helpers for packages that run fasthttp
// servers: real upstreams on loopback that count what reaches them, and
// the goleak options such packages need.
package fasttest

import "go.uber.org/goleak"

// LeakOptions ignore fasthttp's own background goroutines: the
// server-date updater and the client's DNS cache cleaner (process-wide,
// started once, never stopped), and the server's worker-pool and the
// client's connection cleaners, which sleep up to 10 s before they notice
// that their server or client is done and exit.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	}
}
