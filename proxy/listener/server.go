package listener

import (
	"log/slog"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/proxy/respond"
)

// ProxyServer returns a fasthttp server configured to pass messages on
// rather than to originate them: bodies streamed (StreamRequestBody), no
// Server, Date or default Content-Type added (no Name either: fasthttp
// sends a set Name as Server even with NoDefaultServerHeader), no multipart parsing, 8 KiB
// of request head at most (larger heads get 431). Its timeouts are the
// listener's (Start).
//
// A request fasthttp itself cannot parse (a duplicate or malformed
// Content-Length, a bad Transfer-Encoding, a broken header line: most
// smuggling attempts) never reaches h: refuse answers it instead, as the
// component answers (and counts) its own refusals. Without refuse it gets
// warden's JSON error, uncounted.
func ProxyServer(h fasthttp.RequestHandler, refuse func(ctx *fasthttp.RequestCtx, status int, msg string), log *slog.Logger) *fasthttp.Server {
	if refuse == nil {
		refuse = respond.Error
	}
	return &fasthttp.Server{
		Handler: h,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			refuse(ctx, parseErrorStatus(err), parseErrorMessage(err))
		},
		ReadBufferSize: 8 << 10,
		// No ReadTimeout, IdleTimeout or HeaderReceived: Start keeps the
		// slow-client timeouts per connection.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		// Parse errors quote no request bytes: the 400 would echo the
		// client's head back (credentials included) and the debug log
		// would keep it.
		SecureErrorLogMessage: true,
		CloseOnShutdown:       true,
		Logger:                slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}
