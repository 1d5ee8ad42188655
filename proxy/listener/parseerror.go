package listener

import (
	"errors"
	"net"
	"strings"

	"github.com/valyala/fasthttp"
)

// parseErrorStatus is fasthttp's own choice of status for a request it
// could not read: 431 for a head over the read buffer, 408 for a read
// that timed out, else 400.
func parseErrorStatus(err error) int {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		return fasthttp.StatusRequestHeaderFieldsTooLarge
	case errors.As(err, &ne) && ne.Timeout():
		return fasthttp.StatusRequestTimeout
	}
	return fasthttp.StatusBadRequest
}

// parseProblems names, in warden's own words, what fasthttp found wrong
// with a request head. fasthttp's messages quote the offending bytes (a
// header value, the request line) even with SecureErrorLogMessage: echoed
// in a 400 they would hand a client's credentials (a Cookie with a stray
// control byte) back to whoever reads the answer, and kept in a log they
// would store them. So only the kind of mistake is kept; the first match
// in this order names it.
var parseProblems = []struct{ in, say string }{
	{"content-length and transfer-encoding", "both Content-Length and Transfer-Encoding"},
	{"duplicate content-length", "more than one Content-Length"},
	{"content-length", "an invalid Content-Length"},
	{"transfer-encoding", "an invalid Transfer-Encoding"},
	{"too many host", "more than one Host"},
	{"missing required host", "no Host"},
	{"content-type", "conflicting Content-Type fields"},
	{"invalid header key", "an invalid field name"},
	{"invalid header value", "an invalid field value"},
	{"trailer", "an invalid trailer"},
	{"request uri", "an invalid request target"},
	{"invalid uri", "an invalid request target"},
	{"request method", "an invalid method"},
	{"http version", "an unsupported HTTP version"},
	{"whitespace", "a malformed request line"},
	{"small read buffer", "a head larger than the read buffer"},
}

// parseErrorMessage is the body text of the answer to a request fasthttp
// could not read; it never contains a byte of the request.
func parseErrorMessage(err error) string {
	switch {
	case errors.Is(err, ErrBodyIdle):
		return ErrBodyIdle.Error()
	case errors.Is(err, ErrBareLF):
		return "malformed request: " + ErrBareLF.Error()
	}
	if parseErrorStatus(err) == fasthttp.StatusRequestTimeout {
		return "request head not received in time"
	}
	msg := strings.ToLower(err.Error())
	for _, p := range parseProblems {
		if strings.Contains(msg, p.in) {
			return "malformed request: " + p.say
		}
	}
	return "malformed request"
}
