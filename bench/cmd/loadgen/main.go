// Command loadgen drives HTTP load at one address and prints throughput
// and latency percentiles. Closed loop by default; -rate makes it open
// loop. See bench/loadgen.
//
//	loadgen -addr 127.0.0.1:8080 -c 32 -d 5s
//	loadgen -addr 127.0.0.1:8080 -c 32 -rate 20000 -d 5s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/warden-dev/warden/bench/loadgen"
)

func main() {
	var cfg loadgen.Config
	var headers string
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:8080", "host:port to send to")
	flag.StringVar(&cfg.Host, "host", "", "Host header (default: -addr)")
	flag.StringVar(&cfg.Path, "path", "/", "request target")
	flag.StringVar(&headers, "H", "", "extra headers, comma-separated name:value pairs")
	flag.IntVar(&cfg.Concurrency, "c", 32, "workers (one connection each)")
	flag.Float64Var(&cfg.Rate, "rate", 0, "open-loop requests per second (0: closed loop)")
	flag.DurationVar(&cfg.Warmup, "warmup", time.Second, "warm-up before measuring")
	flag.DurationVar(&cfg.Duration, "d", 5*time.Second, "measured duration")
	flag.Parse()
	if headers != "" {
		cfg.Header = map[string]string{}
		for _, kv := range strings.Split(headers, ",") {
			k, v, ok := strings.Cut(kv, ":")
			if !ok {
				fmt.Fprintf(os.Stderr, "loadgen: -H %q: want name:value\n", kv)
				os.Exit(2)
			}
			cfg.Header[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	h := &res.Latency
	fmt.Printf("requests %d errors %d rps %.0f p50 %v p99 %v p99.9 %v max %v\n", res.Requests, res.Errors, res.RPS,
		h.Quantile(0.5), h.Quantile(0.99), h.Quantile(0.999), h.Max())
	if res.FirstError != "" {
		fmt.Println("first error:", res.FirstError)
	}
}
