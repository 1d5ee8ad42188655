package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRunsEndToEnd is the scheduler's acceptance check: warden run with the
// example policy and a worker, then POST /v1/runs on the ingress listener
// answers 202 and the run reaches the worker with its headers, and ends
// COMPLETED.
func TestRunsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	type got struct{ path, id, attempt, tenant, body string }
	arrived := make(chan got, 1)
	worker := serveHTTP(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		arrived <- got{r.URL.Path, r.Header.Get("x-run-id"), r.Header.Get("x-run-attempt"), r.Header.Get("x-tenant-id"), string(b)}
		io.WriteString(w, `{"synced":true}`)
	})

	bin := buildWarden(t)
	path, addrs := examplePolicy(t)
	b, _ := os.ReadFile(path)
	s := strings.Replace(string(b), "worker: http://127.0.0.1:9000", "worker: http://"+worker, 1)
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, bin, nil, "run", "--policy", path, "--data-dir", t.TempDir())
	p.waitLog(t, "warden running")

	req, _ := http.NewRequest(http.MethodPost, "http://"+addrs["ingress"]+"/v1/runs",
		strings.NewReader(`{"name":"tenant_sync","input":{"tenantId":"acme"}}`))
	req.Header.Set("x-tenant-id", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %d %s, want 202", resp.StatusCode, body)
	}
	var receipt struct{ ID, Status string }
	if err := json.Unmarshal(body, &receipt); err != nil || receipt.ID == "" {
		t.Fatalf("receipt %s: %v", body, err)
	}

	select {
	case d := <-arrived:
		if d.path != "/run" || d.id != receipt.ID || d.attempt != "1" || d.tenant != "acme" || !strings.Contains(d.body, `"tenantId":"acme"`) {
			t.Fatalf("delivery %+v for run %s", d, receipt.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the run never reached the worker")
	}

	deadline := time.Now().Add(20 * time.Second)
	for {
		code, view := get(t, "http://"+addrs["ingress"]+"/v1/runs/"+receipt.ID)
		if code == 200 && strings.Contains(view, `"COMPLETED"`) {
			if !strings.Contains(view, `"synced":true`) {
				t.Fatalf("output missing: %s", view)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run never COMPLETED: %d %s", code, view)
		}
		time.Sleep(20 * time.Millisecond) // polling the API is the only view a caller has
	}
}
