package ingress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// heapWatch samples the heap in use until stopped and reports the peak.
type heapWatch struct {
	stop chan struct{}
	wg   sync.WaitGroup
	peak uint64
}

func watchHeap() *heapWatch {
	runtime.GC()
	w := &heapWatch{stop: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		var ms runtime.MemStats
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			w.peak = max(w.peak, ms.HeapInuse)
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *heapWatch) Stop() uint64 {
	close(w.stop)
	w.wg.Wait()
	return w.peak
}

// rssHighWater is the process's peak resident set (VmHWM), for the log.
func rssHighWater() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

const (
	gib        = 1 << 30
	heapBudget = 96 << 20 // far below the 1 GiB that buffering would need
)

// pattern is the generated body: 64 KiB repeated, so the test itself
// holds no large buffer.
var pattern = []byte(strings.Repeat("0123456789abcdef", 4096))

// TestGiBUploadStreams sends a 1 GiB body through the ingress and checks
// that the worker receives every byte while the heap stays bounded.
func TestGiBUploadStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer")
	}
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
		fmt.Fprintf(ctx, "%d %v", n, err)
	})
	w := watchHeap()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", gib)
		for sent := 0; sent < gib; sent += len(pattern) {
			if _, err := c.Write(pattern); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	peak := w.Stop()
	if want := fmt.Sprintf("%d <nil>", gib); string(body) != want {
		t.Fatalf("worker read %q, want %q", body, want)
	}
	t.Logf("1 GiB upload: peak heap in use %d MiB, process RSS high-water %s", peak>>20, rssHighWater())
	if peak > heapBudget {
		t.Fatalf("peak heap %d MiB during a streamed upload (budget %d MiB)", peak>>20, heapBudget>>20)
	}
}

// TestGiBDownloadStreams is the other direction: a 1 GiB response body of
// known length reaches the client with the heap bounded.
func TestGiBDownloadStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer")
	}
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		pr, pw := io.Pipe()
		go func() {
			for sent := 0; sent < gib; sent += len(pattern) {
				if _, err := pw.Write(pattern); err != nil {
					return
				}
			}
			pw.Close()
		}()
		ctx.SetBodyStream(pr, gib)
	})
	w := watchHeap()
	resp, err := http.Get("http://" + f.addr + "/download")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	peak := w.Stop()
	if err != nil || n != gib {
		t.Fatalf("client read %d bytes, err %v", n, err)
	}
	t.Logf("1 GiB download: peak heap in use %d MiB, process RSS high-water %s", peak>>20, rssHighWater())
	if peak > heapBudget {
		t.Fatalf("peak heap %d MiB during a streamed download (budget %d MiB)", peak>>20, heapBudget>>20)
	}
}

// TestEarlyAnswer: a worker that refuses an upload from its head, reading
// none of the body, gets its 413 to the client, with the body announced
// by length or chunked; the client's connection then closes cleanly.
func TestEarlyAnswer(t *testing.T) {
	w := fasttest.RefusingUpstream(t)
	f := startAt(t, "", strings.TrimPrefix(w.URL, "http://"))
	fasttest.CheckEarlyAnswer(t, f.addr, fmt.Sprintf("POST /upload HTTP/1.1\r\nHost: w\r\nContent-Length: %d\r\n\r\n", fasttest.UploadSize))
	fasttest.CheckEarlyAnswer(t, f.addr, "POST /upload HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n")
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("ingress", "worker", "413")); n != 2 {
		t.Errorf("warden_requests_total{ingress,worker,413} = %v, want 2", n)
	}
}

// TestRefusalBeforeBody: a long upload the ingress refuses from its head
// (a tenant over its cap), its body unread, gets the 429, and the
// connection then ends cleanly while the client still sends, by length or
// chunked, rather than by a reset.
func TestRefusalBeforeBody(t *testing.T) {
	f := start(t, "  tenant: { header: x-tenant-id, rate: 1, window: 60 }", func(ctx *fasthttp.RequestCtx) {})
	if resp, _ := fasttest.Raw(t, f.addr, "GET / HTTP/1.1\r\nHost: w\r\nX-Tenant-Id: zero\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("the cap's one request: %d", resp.StatusCode)
	}
	for _, framing := range []string{fmt.Sprintf("Content-Length: %d", fasttest.UploadSize), "Transfer-Encoding: chunked"} {
		fasttest.CheckAnswerBeforeBody(t, f.addr, "POST /upload HTTP/1.1\r\nHost: w\r\nX-Tenant-Id: zero\r\n"+framing+"\r\n\r\n",
			429, "~tenant_rate")
	}
}

// TestHeadOnlyAnswer: a worker that sends the head of a long answer and
// then closes before any of its body gets the client a 502, by length
// and chunked, where the client once saw its connection closed unanswered.
func TestHeadOnlyAnswer(t *testing.T) {
	up := fasttest.StartHeadOnlyUpstream(t)
	f := startAt(t, "", up.Addr)
	fasttest.CheckHeadOnlyAnswer(t, f.addr, "GET /long HTTP/1.1\r\nHost: svc\r\n\r\n")
	fasttest.CheckHeadOnlyAnswer(t, f.addr, "GET /chunked HTTP/1.1\r\nHost: svc\r\n\r\n")
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("ingress", "worker", "502")); n != 2 {
		t.Errorf("warden_requests_total{ingress,worker,502} = %v, want 2", n)
	}
}
