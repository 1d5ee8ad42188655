package httpwire

// Idempotent reports whether a request method is idempotent (RFC 9110
// §9.2.2): sending it twice has the effect of sending it once, so a proxy
// may retry it.
func Idempotent(method []byte) bool {
	switch string(method) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}
