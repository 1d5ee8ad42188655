package scheduler

import (
	"net/http"
	"testing"
)

// The bridge closes a run's database sessions when Done's channel closes.
func TestDoneClosesWhenTheRunEnds(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return http.StatusAccepted, "" })
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: {}`, ""))
	if _, known := h.sched.Done("999999"); known {
		t.Fatal("unknown run reported as known")
	}
	if _, known := h.sched.Done("not-a-number"); known {
		t.Fatal("malformed id reported as known")
	}
	id := h.submit(`{"name":"job"}`).ID
	h.waitPhase(id, phaseAsync)
	ended, known := h.sched.Done(id)
	if !known {
		t.Fatal("running run unknown")
	}
	select {
	case <-ended:
		t.Fatal("Done closed while the run is RUNNING")
	default:
	}
	if r := h.do("POST", "/"+id+"/complete", `{"status":"COMPLETED"}`); r.code != 200 {
		t.Fatalf("complete: %d %s", r.code, r.body)
	}
	recv(t, ended, "Done closed after the run completed")
	again, known := h.sched.Done(id)
	if !known {
		t.Fatal("finished run unknown")
	}
	select {
	case <-again:
	default:
		t.Fatal("Done of a finished run is not already closed")
	}
}
