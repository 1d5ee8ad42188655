package main

import (
	"context"
	"fmt"
	"log/slog"
)

// redisLogger takes go-redis's own log lines (one per failed dial while
// Redis is down) into warden's log, in its format, at debug level: warden
// logs an outage itself, once when it starts and once when it ends, and
// the library's lines would otherwise go to stderr as plain text even
// under --log-format json.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "backend", "redis", "from", "go-redis")
}
