// Package connpool keeps warden's upstream HTTP/1.1 connections: one Pool
// per upstream address of a target, capped at max_connections, with idle
// connections closed after idle_timeout and every connection retired after
// a maximum lifetime so that DNS changes are picked up (each new connection
// resolves the name again).
//
// It is built on fasthttp's request and response types rather than on
// fasthttp.HostClient because a proxy needs what HostClient hides: it never
// resends a request by itself (warden's retry policy and budget decide every
// retry), streamed response bodies are handed over, once their first byte
// has come, with the connection still attached and returned to the pool
// when the body ends, and an idle
// connection the upstream may have closed is probed before it is reused
// instead of failing the request that picked it. A long request body is
// sent while the answer is read, so that an upstream answering before it
// has the whole body (a 413) is heard rather than reported as a failed
// write.
//
// Pools are replaced cleanly on reload: a Set hands out the existing Pool
// for unchanged settings, and a replaced Pool keeps serving the exchanges
// already holding its connections, closing each as it is released.
package connpool
