package listener

import (
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/proxy/respond"
)

// idleTimeout closes client keep-alive connections idle this long.
const idleTimeout = 90 * time.Second

// HeaderTimeout bounds reading a request's head, from its first byte (on a
// new connection, from the connection): nginx's client_header_timeout. A
// client that sends part of a head and stalls gets 408 then; one that
// sends nothing on a new connection is closed. The body is not bounded
// here: a streamed upload may take as long as it takes (the egress
// target's timeout bounds its requests).
const HeaderTimeout = 60 * time.Second

// bodyTimeout replaces HeaderTimeout once the head is read: the read
// deadline then only guards against a connection nobody closes.
const bodyTimeout = 24 * time.Hour

// ProxyServer returns a fasthttp server configured to pass messages on
// rather than to originate them: bodies streamed (StreamRequestBody), no
// Server, Date or default Content-Type added (no Name either: fasthttp
// sends a set Name as Server even with NoDefaultServerHeader), no multipart parsing, 8 KiB
// of request head at most (larger heads get 431).
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
		IdleTimeout:    idleTimeout,
		ReadTimeout:    HeaderTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: bodyTimeout}
		},
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
