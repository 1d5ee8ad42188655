// Package fasttest holds test helpers for packages that run fasthttp
// servers: real upstreams on loopback that count what reaches them, and
// the goleak options such packages need.
package fasttest

import "go.uber.org/goleak"

// LeakOptions ignore fasthttp's process-wide goroutines: the server-date
// updater (started once, never stopped) and the worker-pool cleaner, which
// sleeps up to MaxIdleWorkerDuration before it sees that its server
// stopped and then exits.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	}
}
