package scheduler

import (
	"context"
	"sync"
	"testing"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/scheduler/store"
)

// BenchmarkRunLifecycle is one run's whole path with the memory store and
// an in-process worker: submit, admission, STARTING, delivery, COMPLETED,
// release. make bench-scheduler measures the same against a channel.
func BenchmarkRunLifecycle(b *testing.B) {
	benchLifecycle(b, window.NewMemory(clock.Real{}))
}

// BenchmarkRunLifecycleRedisLanes is BenchmarkRunLifecycle with the lanes
// shared through Redis (the machine's Redis, a key prefix of its own).
func BenchmarkRunLifecycleRedisLanes(b *testing.B) {
	url := testenv.RedisURL(b)
	red, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: url}, Prefix: redistest.Prefix(b, url)}, clock.Real{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer red.Close()
	benchLifecycle(b, red)
}

// benchLifecycle runs b.N runs through a scheduler whose gates count in
// counter (Redis lanes when it is a window.Redis).
func benchLifecycle(b *testing.B, counter window.Counter) {
	p, err := policy.Parse("b.yaml", []byte(`version: 1
ingress: { listen: 127.0.0.1:0, worker: http://127.0.0.1:9 }
scheduler:
  lanes: 64
  worker_max_concurrent: 64
  definitions:
    job: { key: "${input.k}", key_concurrency: 8 }
`))
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	s := New(Options{Store: store.NewMemory(), Counter: counter, Deliver: func(context.Context, Delivery) Reply {
		wg.Done()
		return Reply{Status: 200}
	}})
	if err := s.Apply(context.Background(), governor.New(clock.Real{}, nil, counter).Apply(p)); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	inputs := [][]byte{[]byte(`{"k":"a"}`), []byte(`{"k":"b"}`), []byte(`{"k":"c"}`), []byte(`{"k":"d"}`)}
	b.ReportAllocs()
	wg.Add(b.N)
	b.ResetTimer()
	for i := range b.N {
		if _, _, err := s.Submit(context.Background(), SubmitRequest{Name: "job", Input: inputs[i%len(inputs)]}); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}
