// Package httpwire holds the HTTP/1.1 wire rules warden's proxies enforce
// and that fasthttp leaves to the application: framing checks against
// request smuggling, hop-by-hop header removal, request-target and
// authority parsing for egress routing, request IDs, and X-Forwarded-For.
//
// Everything here works on bytes the caller owns and allocates nothing; the
// proxies call it once per request.
package httpwire
