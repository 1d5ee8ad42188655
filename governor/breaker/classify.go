package breaker

// ClassifyHTTP maps a response status to an Outcome. Only server-side
// trouble counts against the target: 5xx and 429 (the target shedding
// load). Other 4xx are the caller's mistake and say nothing about the
// target's health, so a storm of 404s must never open the breaker. A status
// below 100 means no valid response arrived, which is a failure like a
// connection error.
func ClassifyHTTP(status int) Outcome {
	if status == 429 || status >= 500 || status < 100 {
		return Failure
	}
	return Success
}

// gRPC status codes that matter here (google.golang.org/grpc/codes values),
// spelled out so this package need not import grpc.
const (
	grpcCancelled         = 1
	grpcUnknown           = 2
	grpcDeadlineExceeded  = 4
	grpcResourceExhausted = 8
	grpcInternal          = 13
	grpcUnavailable       = 14
)

// ClassifyGRPC maps a grpc-status code to an Outcome: the codes that signal
// an unhealthy or overloaded server are failures; CANCELLED is the client
// giving up, which says nothing either way; every other code (including
// INVALID_ARGUMENT, NOT_FOUND, ...) is an answer from a working server.
func ClassifyGRPC(code int) Outcome {
	switch code {
	case grpcUnavailable, grpcDeadlineExceeded, grpcResourceExhausted, grpcInternal, grpcUnknown:
		return Failure
	case grpcCancelled:
		return Neutral
	}
	return Success
}
