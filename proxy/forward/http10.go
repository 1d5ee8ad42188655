package forward

import (
	"fmt"
	"io"

	"github.com/valyala/fasthttp"
)

// HTTP10BodyMax bounds a response of unknown length read whole for an
// HTTP/1.0 client.
const HTTP10BodyMax = 8 << 20

// FrameForHTTP10 gives an HTTP/1.0 client a response it can read. A
// streamed response of unknown length (chunked, or ending when the upstream
// closes) would go out chunked, which HTTP/1.0 does not know, and fasthttp,
// which writes responses, has no close-delimited mode: so the body is read
// whole, up to HTTP10BodyMax, and sent with a Content-Length. A longer or
// broken one becomes a 502 saying why, and *code (the status the exchange
// records when its stream is closed) says 502 too. The stream is closed
// either way, which ends the upstream exchange. It returns the reason of
// a 502, which the caller writes.
func FrameForHTTP10(ctx *fasthttp.RequestCtx, code *int) error {
	resp := &ctx.Response
	if ctx.Request.Header.IsHTTP11() || !resp.IsBodyStream() || resp.Header.ContentLength() >= 0 {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.BodyStream(), HTTP10BodyMax+1))
	switch {
	case err != nil:
		err = fmt.Errorf("read the response for an HTTP/1.0 client: %w", err)
	case len(body) > HTTP10BodyMax:
		err = fmt.Errorf("response of unknown length over %d MiB: an HTTP/1.0 client cannot be sent it", HTTP10BodyMax>>20)
	}
	if err != nil {
		*code = fasthttp.StatusBadGateway
	}
	_ = resp.CloseBodyStream() // ends the exchange: *code is recorded now
	if err != nil {
		return err
	}
	resp.SetBody(body)
	return nil
}
