package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// measureRLS runs rlsLoad and adds Redis's CPU time over the same measured
// span, read from the server's INFO (so it includes whatever else that
// Redis served meanwhile).
func measureRLS(o options, addr, client string, serverCPU func() float64) result {
	p := &cpuProbe{server: serverCPU}
	if opt, err := redis.ParseURL(o.url); err == nil {
		p.rdb = redis.NewClient(opt)
		defer p.rdb.Close()
	}
	r := rlsLoad(o, addr, client, p.read)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.redis) == 2 && p.redis[0] >= 0 && p.redis[1] >= 0 {
		r.RedisCPU = p.redis[1] - p.redis[0]
	}
	return r
}

// cpuProbe reads the server's CPU time and, beside it, Redis's.
type cpuProbe struct {
	server func() float64
	rdb    *redis.Client
	mu     sync.Mutex
	redis  []float64 // one reading per call; -1 when unreadable
}

func (p *cpuProbe) read() float64 {
	v := p.server()
	r := -1.0
	if p.rdb != nil {
		r = redisCPU(p.rdb)
	}
	p.mu.Lock()
	p.redis = append(p.redis, r)
	p.mu.Unlock()
	return v
}

// redisCPU is used_cpu_user + used_cpu_sys from INFO cpu, or -1.
func redisCPU(rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return -1
	}
	total, seen := 0.0, 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			total += f
			seen++
		}
	}
	if seen != 2 {
		return -1
	}
	return total
}

// median of xs (0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
