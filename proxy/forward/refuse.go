package forward

import (
	"errors"
	"os"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/proxy/listener"
	"github.com/warden-dev/warden/proxy/respond"
)

// RefuseBody answers a request whose body could not be read (an error of
// Prepare, or an exchange's connpool.KindClient error) and returns the
// status, and whether the exchange's deadline was what passed, which the
// caller counts as its target's timeout:
//
//   - the body stalled for the listener's body_idle (listener.ErrBodyIdle):
//     408, and the connection closes, as the rest of the body is not read;
//   - the exchange's deadline passed while the body was arriving: 504
//     `timeout` for target, saying which deadline (bound: "ingress.timeout",
//     "the target's timeout");
//   - anything else: 400.
func RefuseBody(ctx *fasthttp.RequestCtx, target, bound string, err error) (status int, timedOut bool) {
	switch {
	case errors.Is(err, listener.ErrBodyIdle):
		respond.Error(ctx, fasthttp.StatusRequestTimeout, listener.ErrBodyIdle.Error())
		ctx.SetConnectionClose()
		return fasthttp.StatusRequestTimeout, false
	case errors.Is(err, ErrBodyTimeout) || errors.Is(err, os.ErrDeadlineExceeded):
		return respond.Upstream(ctx, target, &connpool.Error{Kind: connpool.KindTimeout, Op: "read the request for",
			Addr: target, Err: errors.New(bound + " passed while the request body was arriving")}), true
	}
	respond.Error(ctx, fasthttp.StatusBadRequest, err.Error())
	return fasthttp.StatusBadRequest, false
}
