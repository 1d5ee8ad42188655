package scheduler

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/policy"
)

// A sidecar on a shared store keeps its owner id in its data directory, so
// a restart finds its own runs: these tests restart one in-process (a
// scheduler stopped as SIGTERM stops it, then a new one on the same
// directory and database).

// restartable starts schedulers on db, one data directory, and policy.
type restartable struct {
	t      *testing.T
	db     *sharedDB
	dir    string
	policy string
	opts   []harnessOpt
}

func (r *restartable) start() *harness {
	r.t.Helper()
	st := r.db.open(r.t)
	r.t.Cleanup(func() { st.Close() })
	return newHarness(r.t, r.policy, append([]harnessOpt{withStore(st), withDataDir(r.dir)}, r.opts...)...)
}

// row reads a run's status and owner in the store.
func (db *sharedDB) row(t *testing.T, id string) (status int, owner string, leaseUntil int64) {
	t.Helper()
	var st int16
	if err := db.conn.QueryRow(context.Background(), "SELECT status, owner, lease_until FROM warden_runs WHERE seq = $1", mustSeq(id)).
		Scan(&st, &owner, &leaseUntil); err != nil {
		t.Fatal(err)
	}
	return int(st), owner, leaseUntil
}

func (db *sharedDB) waitRow(t *testing.T, what, where string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); db.count(t, where) == 0; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s (%s)", what, where)
		}
	}
}

// A run the worker accepted (202) before the sidecar was stopped is still
// that sidecar's after a restart on the same data directory: its owner id
// is the same, its lease is renewed at start (a sweep past the previous
// process's lease leaves it RUNNING), it still counts for
// worker_max_concurrent and keeps its semaphore permit, and heartbeat and
// complete through the restarted sidecar succeed.
func TestSharedStoreRestartKeepsRunningRuns(t *testing.T) {
	db := newSharedDB(t)
	w := newWorker(t, func(d delivery) (int, string) { return 202, "" })
	r := &restartable{t: t, db: db, dir: t.TempDir(), opts: []harnessOpt{withLease(time.Minute)},
		policy: policyYAML(w.srv.URL, `
  lanes: 5
  worker_max_concurrent: 1
  semaphores: { erp: 1 }
  definitions:
    job: { semaphores: [erp], heartbeat_timeout: 1h }
    other: {}`, "")}
	h1 := r.start()
	id := h1.submit(`{"name":"job"}`).ID
	if d := w.next(t); d.id != id || d.attempt != "1" {
		t.Fatalf("delivered run %s attempt %s, want %s attempt 1", d.id, d.attempt, id)
	}
	// RUNNING recorded, and the permit leased after the 202.
	db.waitRow(t, "the 202 is recorded", "status = 3 AND seq = "+id)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var n int64
		db.conn.QueryRow(context.Background(), "SELECT count(*) FROM warden_permits WHERE seq = $1 AND expires_at <> 0", mustSeq(id)).Scan(&n)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the permit of the accepted run was never leased")
		}
	}
	_, owner, leaseBefore := db.row(t, id)
	saved, err := os.ReadFile(filepath.Join(r.dir, SidecarIDFile))
	if err != nil || strings.TrimSpace(string(saved)) != owner {
		t.Fatalf("sidecar-id file %q (%v); the store names owner %q", saved, err, owner)
	}
	h1.shutdown()

	h2 := r.start()
	if st, o, lease := db.row(t, id); st != 3 || o != owner || lease <= leaseBefore {
		t.Fatalf("after the restart the run is status %d owner %q lease %d; want RUNNING (3), owner %q, lease renewed past %d",
			st, o, lease, owner, leaseBefore)
	}
	// Still counted for this sidecar's worker_max_concurrent (the claim
	// counts admitted runs by owner).
	other := h2.submit(`{"name":"other"}`)
	if deref(other.Control) != ControlWorker {
		t.Fatalf("a run submitted while the restarted sidecar's worker holds its only slot: control %s, want %s",
			deref(other.Control), ControlWorker)
	}
	if rep := h2.do("POST", "/"+id+"/heartbeat", ""); rep.code != http.StatusOK {
		t.Fatalf("heartbeat through the restarted sidecar: %d %s", rep.code, rep.body)
	}
	// A sweep once the previous process's lease has passed (any sidecar's)
	// leaves the run alone: the restarted process renewed it.
	h2.sched.adm.(*postgresAdmitter).sweep(context.Background(), time.Unix(0, leaseBefore+1))
	if st, _, _ := db.row(t, id); st != 3 {
		t.Fatalf("a sweep after the previous lease moved the run to status %d; want it RUNNING", st)
	}
	var permits int64
	if err := db.conn.QueryRow(context.Background(), "SELECT count(*) FROM warden_permits WHERE seq = $1", mustSeq(id)).Scan(&permits); err != nil || permits != 1 {
		t.Fatalf("permits held by the run after the restart: %d %v, want 1", permits, err)
	}
	rep := h2.do("POST", "/"+id+"/complete", `{"status":"COMPLETED","output":{"done":true}}`)
	if rep.code != http.StatusOK {
		t.Fatalf("complete through the restarted sidecar: %d %s", rep.code, rep.body)
	}
	if v := h2.waitStatus(id, "COMPLETED"); v.Attempt != 1 || string(v.Output) != `{"done":true}` {
		t.Fatalf("completed run: attempt %d output %s", v.Attempt, v.Output)
	}
	// The slot it held goes to the waiting run.
	if d := w.next(t); d.id != other.ID {
		t.Fatalf("delivered run %s after the complete, want %s", d.id, other.ID)
	}
}

// A delivery in flight when the sidecar stopped (left STARTING: the drain
// gave up on it) is queued again as soon as the sidecar restarts on the
// same data directory — not when its lease would have ended (a minute, on
// a clock that does not move) — with its rate slot refunded (a pool of one
// run a minute admits it again in the same window) and the next
// x-run-attempt.
func TestSharedStoreRestartRequeuesStarting(t *testing.T) {
	db := newSharedDB(t)
	release := make(chan struct{})
	defer close(release)
	w := newWorker(t, func(d delivery) (int, string) {
		if d.attempt == "1" {
			<-release
		}
		return 200, `{"ok":true}`
	})
	r := &restartable{t: t, db: db, dir: t.TempDir(), opts: []harnessOpt{withLease(time.Minute), withFakeClock()},
		policy: policyYAML(w.srv.URL, `
  lanes: 5
  definitions:
    job: { pool: api }`, "pools:\n  api: { rate: 1, window: 60 }\n")}
	h1 := r.start()
	id := h1.submit(`{"name":"job"}`).ID
	if d := w.next(t); d.id != id || d.attempt != "1" {
		t.Fatalf("delivered run %s attempt %s, want %s attempt 1", d.id, d.attempt, id)
	}
	// SIGTERM whose grace is already over: the delivery is abandoned.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h1.sched.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := db.row(t, id); st != 2 {
		t.Fatalf("after the drain the run is status %d, want STARTING (2)", st)
	}
	slots := func() int {
		var n int64
		if err := db.conn.QueryRow(context.Background(), "SELECT coalesce(sum(count), 0) FROM warden_pool_windows").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	if n := slots(); n != 1 {
		t.Fatalf("%d rate slots counted before the restart, want 1", n)
	}

	h2 := r.start()
	if d := w.next(t); d.id != id || d.attempt != "2" {
		t.Fatalf("after the restart: delivered run %s attempt %s, want %s attempt 2", d.id, d.attempt, id)
	}
	if v := h2.waitStatus(id, "COMPLETED"); v.Attempt != 2 {
		t.Fatalf("completed on attempt %d, want 2", v.Attempt)
	}
	if n := slots(); n != 1 {
		t.Fatalf("%d rate slots counted after the redelivery, want 1 (the interrupted one refunded)", n)
	}
}

// Two live processes never share an owner id: while a sidecar on a shared
// store runs, a second process on its data directory refuses to start,
// naming the directory (and so does a second scheduler in the same
// process). Once the first has stopped, a process on the directory starts
// under the same id: the run the worker accepted from the first is its
// own (complete succeeds) and its new claims carry that id.
func TestSharedStoreDataDirLocked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	db := newSharedDB(t)
	w := newWorker(t, func(d delivery) (int, string) { return 202, "" })
	dir := t.TempDir()
	yaml := policyYAML(w.srv.URL, `
  lanes: 5
  store: { kind: postgres, url: "`+db.url+`" }
  definitions:
    job: {}`, "")
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &restartable{t: t, db: db, dir: dir, policy: yaml}
	h := r.start()
	first := h.submit(`{"name":"job"}`).ID
	db.waitRow(t, "the worker accepted the run", "status = 3 AND seq = "+first)
	_, owner, _ := db.row(t, first)

	// Bounded: a second process that did start would serve until killed.
	cctx, ccancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer ccancel()
	cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childPolicyEnv+"="+policyFile, childDirEnv+"="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("a second process on the data directory: %v, want exit status 1\n%s", err, stderr.String())
	}
	if out := stderr.String(); !strings.Contains(out, dir) || !strings.Contains(out, "locked by another process") {
		t.Fatalf("the refusal does not name the locked data directory %s:\n%s", dir, out)
	}
	st := db.open(t)
	defer st.Close()
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	second := New(Options{Store: st, DataDir: dir})
	if err := second.Apply(context.Background(), h.gov.Apply(p)); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("a second scheduler on the data directory: %v, want a refusal naming %s", err, dir)
	}

	h.shutdown()
	c := startChild(t, policyFile, dir)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Post(c.base, "application/json", strings.NewReader(`{"name":"job"}`))
	if err != nil {
		t.Fatal(err)
	}
	var v RunView
	if err := decodeJSON(resp.Body, &v); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit to the second process once the first stopped: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	db.waitRow(t, "the second process's worker accepted its run", "status = 3 AND seq = "+v.ID)
	if _, o, _ := db.row(t, v.ID); o != owner {
		t.Fatalf("the second process claims as %q, the first as %q: want one id per data directory", o, owner)
	}
	resp, err = client.Post(c.base+"/"+first+"/complete", "application/json", strings.NewReader(`{"status":"COMPLETED"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("complete, through the process that replaced it, a run the first process delivered: %d\n%s", resp.StatusCode, c.stderr)
	}
	if st, _, _ := db.row(t, first); st != 5 {
		t.Fatalf("run %s is status %d after its complete, want COMPLETED (5)", first, st)
	}
}

// Options.Owner, when set, is the owner id whatever the data directory
// holds: the directory is neither read, written nor locked.
func TestSharedStoreOwnerOptionWins(t *testing.T) {
	db := newSharedDB(t)
	w := newWorker(t, func(d delivery) (int, string) { return 202, "" })
	dir := t.TempDir()
	yaml := policyYAML(w.srv.URL, `
  lanes: 5
  definitions:
    job: {}`, "")
	r := &restartable{t: t, db: db, dir: dir, policy: yaml, opts: []harnessOpt{withOwner("sidecar-a")}}
	a := r.start()
	id := a.submit(`{"name":"job"}`).ID
	db.waitRow(t, "the worker accepted the run", "status = 3 AND seq = "+id)
	if _, o, _ := db.row(t, id); o != "sidecar-a" {
		t.Fatalf("run claimed by owner %q, want sidecar-a", o)
	}
	if _, err := os.Stat(filepath.Join(dir, SidecarIDFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sidecar-id written although Options.Owner is set: %v", err)
	}
	// Not locked either: another scheduler with an owner of its own starts
	// on the same directory.
	r.opts = []harnessOpt{withOwner("sidecar-b")}
	r.start()
}
