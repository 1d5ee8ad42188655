package listener

import (
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"
)

// idleTimeout closes client keep-alive connections idle this long.
const idleTimeout = 90 * time.Second

// ProxyServer returns a fasthttp server configured to pass messages on
// rather than to originate them: bodies streamed (StreamRequestBody), no
// Server, Date or default Content-Type added (no Name either: fasthttp
// sends a set Name as Server even with NoDefaultServerHeader), no multipart parsing, 8 KiB
// of request head at most (larger heads get 431).
func ProxyServer(h fasthttp.RequestHandler, log *slog.Logger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      h,
		ReadBufferSize:               8 << 10,
		IdleTimeout:                  idleTimeout,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		Logger:                       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}
