package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/pgtest"
)

// tcpRelay forwards a loopback port to Postgres and can be cut and
// restored, so a test can make the database unreachable without stopping
// the shared server.
type tcpRelay struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newRelay(t *testing.T, target string) *tcpRelay {
	r := &tcpRelay{t: t, target: target, conns: map[net.Conn]bool{}}
	r.listen("127.0.0.1:0")
	t.Cleanup(func() { r.cut(); r.wg.Wait() })
	return r
}

func (r *tcpRelay) listen(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.ln, r.addr = ln, ln.Addr().String()
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", r.target)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns[c], r.conns[up] = true, true
			r.mu.Unlock()
			r.wg.Add(2)
			go func() { defer r.wg.Done(); io.Copy(up, c); up.Close() }()
			go func() { defer r.wg.Done(); io.Copy(c, up); c.Close() }()
		}
	}()
}

// cut closes the listener and every relayed connection.
func (r *tcpRelay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

func (r *tcpRelay) restore() { r.listen(r.addr) }

// warden run with scheduler.store.kind postgres: runs are stored in and
// admitted from Postgres, /v1/queues and /v1/semaphores read the shared
// store, and /readyz fails while Postgres is unreachable and recovers with
// it.
func TestPostgresRunStore(t *testing.T) {
	u := pgtest.SchemaURL(t, "warden_app")
	relay := newRelay(t, u.Host)
	u.Host = relay.addr
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()

	worker, accepted := acceptingWorker(t) // the worker keeps the run: it holds its permit
	a := startApp(t, fmt.Sprintf(`version: 1
admin: { listen: "127.0.0.1:0" }
ingress: { listen: "127.0.0.1:0", worker: %q }
scheduler:
  lanes: 5
  store: { kind: postgres, url: %q }
  semaphores: { erp: 2 }
  definitions:
    job: { semaphores: [erp] }
`, worker.URL, u.String()), "", clock.Real{})
	admin := "http://" + a.AdminAddr()
	if code, body := getStatus(t, admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz with Postgres up: %d %s", code, body)
	}
	resp, err := http.Post("http://"+a.ingressAddr()+"/v1/runs", "application/json", strings.NewReader(`{"name":"job"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %d", resp.StatusCode)
	}
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the run never reached the worker")
	}
	// The permit is leased once the worker's 202 is recorded.
	deadline := time.Now().Add(10 * time.Second)
	for {
		sems := getBody(t, admin+"/v1/semaphores")
		queues := getBody(t, admin+"/v1/queues")
		var semRows []struct {
			Name          string
			Permits, Held int
		}
		var queueRows []struct {
			Scope, Definition string
			Depth, Running    int
		}
		json.Unmarshal([]byte(sems), &semRows)
		json.Unmarshal([]byte(queues), &queueRows)
		if len(semRows) == 1 && semRows[0].Name == "erp" && semRows[0].Permits == 2 && semRows[0].Held == 1 &&
			len(queueRows) == 1 && queueRows[0].Definition == "job" && queueRows[0].Depth == 0 && queueRows[0].Running == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin views do not show the shared store:\n%s\n%s", sems, queues)
		}
		time.Sleep(10 * time.Millisecond)
	}

	relay.cut()
	if code, body := getStatus(t, admin+"/readyz"); code != 503 || !strings.Contains(body, "postgres") {
		t.Fatalf("/readyz with Postgres unreachable: %d %s", code, body)
	}
	relay.restore()
	deadline = time.Now().Add(10 * time.Second)
	for {
		code, body := getStatus(t, admin+"/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after Postgres came back: %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
