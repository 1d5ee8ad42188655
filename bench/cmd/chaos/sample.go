package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// usage is one reading of warden's resources: resident memory from
// /proc/PID/status, open descriptors from /proc/PID/fd and goroutines from
// its /metrics (go_goroutines). A figure that could not be read is -1.
type usage struct {
	at         time.Time
	rss        int64 // bytes
	fds        int
	goroutines int
}

// readUsage reads pid's memory and descriptors now; goroutines come from
// the sampler's scraper.
func readUsage(pid int) usage {
	u := usage{at: time.Now(), rss: -1, fds: -1, goroutines: -1}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
				f := bytes.Fields(v)
				if len(f) >= 1 {
					if kb, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
						u.rss = kb * 1024
					}
				}
			}
		}
	}
	if d, err := os.Open(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		names, err := d.Readdirnames(-1)
		d.Close()
		if err == nil {
			u.fds = len(names)
		}
	}
	return u
}

// sampler reads warden's usage every 100 ms while a scenario runs. It
// follows the process across a restart (its PID is asked each time).
type sampler struct {
	w *warden

	mu      sync.Mutex
	samples []usage
	gor     int       // latest go_goroutines
	gorAt   time.Time // when it was read

	loops []*repeater
}

// sampleEvery is how often the sampler reads.
const sampleEvery = 100 * time.Millisecond

func startSampler(ctx context.Context, w *warden) *sampler {
	s := &sampler{w: w, gor: -1}
	s.loops = []*repeater{
		repeat(ctx, sampleEvery, func(context.Context) { s.take() }),
		// Scraping /metrics may stall while warden is out of descriptors;
		// it runs apart, so that memory and descriptors are still read.
		repeat(ctx, sampleEvery, s.scrape),
	}
	return s
}

// scrape reads go_goroutines now.
func (s *sampler) scrape(ctx context.Context) {
	if n, err := s.w.goroutines(ctx); err == nil {
		s.mu.Lock()
		s.gor, s.gorAt = n, time.Now()
		s.mu.Unlock()
	}
}

// take records one reading and returns it.
func (s *sampler) take() usage {
	pid := s.w.pid()
	if pid == 0 {
		return usage{at: time.Now(), rss: -1, fds: -1, goroutines: -1}
	}
	u := readUsage(pid)
	s.mu.Lock()
	if time.Since(s.gorAt) < time.Second {
		u.goroutines = s.gor
	}
	s.samples = append(s.samples, u)
	s.mu.Unlock()
	return u
}

func (s *sampler) stop() {
	for _, l := range s.loops {
		l.stop()
	}
}

// all returns a copy of the readings so far.
func (s *sampler) all() []usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]usage(nil), s.samples...)
}

// peak is the largest reading of each figure.
func peak(us []usage) usage {
	p := usage{rss: -1, fds: -1, goroutines: -1}
	for _, u := range us {
		p.rss = max(p.rss, u.rss)
		p.fds = max(p.fds, u.fds)
		p.goroutines = max(p.goroutines, u.goroutines)
	}
	return p
}

// slope is the least-squares slope of ys over xs (units of y per unit of
// x); ok is false with fewer than two distinct xs.
func slope(xs, ys []float64) (float64, bool) {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0, false
	}
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range xs {
		dx := xs[i] - mx
		sxx += dx * dx
		sxy += dx * (ys[i] - my)
	}
	if sxx == 0 {
		return 0, false
	}
	return sxy / sxx, true
}

// slopes are the per-minute trends of memory (MB), descriptors and
// goroutines over the readings taken at or after from.
type slopes struct {
	rssMB, fds, goroutines float64
	n                      int
}

func trend(us []usage, from time.Time) slopes {
	var t, rss, fds, gor, tg []float64
	for _, u := range us {
		if u.at.Before(from) || u.rss < 0 || u.fds < 0 {
			continue
		}
		m := u.at.Sub(from).Minutes()
		t = append(t, m)
		rss = append(rss, float64(u.rss)/1e6)
		fds = append(fds, float64(u.fds))
		if u.goroutines >= 0 {
			tg = append(tg, m)
			gor = append(gor, float64(u.goroutines))
		}
	}
	var s slopes
	s.n = len(t)
	s.rssMB, _ = slope(t, rss)
	s.fds, _ = slope(t, fds)
	s.goroutines, _ = slope(tg, gor)
	return s
}

// writeUsage writes the readings as CSV: seconds since the first, RSS in
// bytes, descriptors, goroutines (-1: not read).
func writeUsage(path string, us []usage) error {
	var b bytes.Buffer
	b.WriteString("seconds,rss_bytes,fds,goroutines\n")
	for _, u := range us {
		fmt.Fprintf(&b, "%.1f,%d,%d,%d\n", u.at.Sub(us[0].at).Seconds(), u.rss, u.fds, u.goroutines)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
