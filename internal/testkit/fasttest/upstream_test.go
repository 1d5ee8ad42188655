package fasttest

import (
	"runtime"
	"testing"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, LeakOptions()...) }

// TestUpstreamStopsBeforeServing: an upstream a test never uses is stopped
// by its cleanup even when Serve has not run yet. With one processor the
// Serve goroutine only runs once the cleanup blocks, after Shutdown, which
// then found no listener to close and left Serve accepting for ever.
func TestUpstreamStopsBeforeServing(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	t.Run("unused", func(t *testing.T) {
		StartUpstream(t, func(*fasthttp.RequestCtx) {})
	})
}
