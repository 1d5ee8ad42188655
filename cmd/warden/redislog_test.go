package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

func TestRedisLoggerWritesWardenLogLines(t *testing.T) {
	for _, level := range []string{"debug", "info"} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, "json", level)
		if err != nil {
			t.Fatal(err)
		}
		redisLogger{log}.Printf(context.Background(), "redis: %s failed to dial: %v", "pool.go:770", "connection refused")
		if level == "info" {
			if buf.Len() != 0 {
				t.Fatalf("at info: %s", buf.Bytes())
			}
			continue
		}
		var line struct{ Level, Msg, Backend string }
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("not a JSON log line: %q: %v", buf.Bytes(), err)
		}
		if line.Level != "DEBUG" || line.Msg != "redis: pool.go:770 failed to dial: connection refused" || line.Backend != "redis" {
			t.Fatalf("%+v", line)
		}
	}
}
