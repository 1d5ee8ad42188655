package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
)

// Errors of the run API besides *BadRequest.
var (
	ErrNotFound = errors.New("run not found")
	ErrStopped  = errors.New("scheduler is not running")
)

// Conflict refuses an operation the run's status does not allow (HTTP 409).
type Conflict struct{ Msg string }

func (e *Conflict) Error() string { return e.Msg }

// RunView is a run as the API shows it (SPEC §6).
type RunView struct {
	ID                    string          `json:"id"`
	Name                  string          `json:"name"`
	Status                string          `json:"status"`
	AwaitingAdmission     bool            `json:"awaiting_admission"`
	Control               *string         `json:"control"`
	Attempt               int             `json:"attempt"`
	Priority              int             `json:"priority"`
	Key                   string          `json:"key,omitempty"`
	CreatedAt             *time.Time      `json:"created_at"`
	StartedAt             *time.Time      `json:"started_at"`
	FinishedAt            *time.Time      `json:"finished_at"`
	RetryAt               *time.Time      `json:"retry_at,omitempty"`
	NotBefore             *time.Time      `json:"not_before,omitempty"` // SCHEDULED: when it joins the queue
	ReasonForIncompletion *string         `json:"reason_for_incompletion"`
	Output                json.RawMessage `json:"output"`
}

// Receipt is the answer to a submission (the 202 body of SPEC §6).
type Receipt struct {
	ID                string  `json:"id"`
	Status            string  `json:"status"`
	AwaitingAdmission bool    `json:"awaiting_admission"`
	Control           *string `json:"control"`
}

func receiptOf(v RunView) Receipt {
	return Receipt{ID: v.ID, Status: v.Status, AwaitingAdmission: v.AwaitingAdmission, Control: v.Control}
}

// SubmitRequest is one run to queue.
type SubmitRequest struct {
	Name           string
	Input          []byte // raw JSON; nil means {}
	Priority       *int32 // nil: the definition's priority
	IdempotencyKey string
	// NotBefore, when later than now, keeps the run SCHEDULED until then;
	// Delay, when positive, is NotBefore as a wait from now.
	NotBefore time.Time
	Delay     time.Duration
	// Header reads the submit request's headers, for ${header.x} keys and
	// the run's tenant; nil means none.
	Header func(name string) []byte
}

// Submit stores a run durably and queues it, admitting it at once when
// every gate has room. created is false when the idempotency key named an
// existing run, which is returned as it is now.
func (s *Scheduler) Submit(ctx context.Context, req SubmitRequest) (Receipt, bool, error) {
	if !s.enter() {
		return Receipt{}, false, ErrStopped
	}
	defer s.leave()
	cfg := s.cfgPtr.Load()
	d := cfg.defs[req.Name]
	if d == nil {
		return Receipt{}, false, unknownDefinition(cfg, req.Name)
	}
	if req.Input == nil {
		req.Input = []byte("{}")
	}
	now := s.clk.Now()
	r := &store.Run{
		Name: req.Name, Status: store.Queued, Priority: d.priority, Input: req.Input,
		IdempotencyKey: req.IdempotencyKey, CreatedAt: now.UnixNano(), QueuedAt: now.UnixNano(),
	}
	if req.Priority != nil {
		r.Priority = *req.Priority
	}
	if req.Header != nil {
		r.Tenant = string(req.Header(cfg.tenantHeader))
	}
	r.Key = d.key.resolve(req.Input, req.Header)
	due := req.NotBefore
	if req.Delay > 0 {
		due = now.Add(req.Delay)
	}
	if due.After(now) {
		return s.submitScheduled(ctx, r, due)
	}

	// A run every gate admits right now is stored already STARTING: one
	// durable write instead of two before it reaches the worker. Pending
	// admissions go first, so this never overtakes a waiting run that
	// could start.
	s.mu.Lock()
	started := s.admitLocked(now)
	a := s.reserveLocked(d, r.Key, r.Priority, now)
	s.mu.Unlock()
	s.launch(started)
	if a != nil {
		r.Status, r.Attempt, r.StartedAt = store.Starting, 1, now.UnixNano()
		if ws := a.lease.WindowStart(); !ws.IsZero() {
			r.PoolID, r.WindowStart = d.pool.ID(), ws.UnixNano()
		}
	}
	created, err := s.st.Submit(ctx, r)
	if a != nil && (err != nil || !created) {
		s.unreserve(a)
	}
	if err != nil {
		return Receipt{}, false, fmt.Errorf("store run: %w", err)
	}
	if !created {
		v, err := s.view(ctx, r.Seq)
		return receiptOf(v), false, err
	}
	s.added(r.Status)
	id := s.formatID(r.Seq)
	if a != nil {
		a.seq = r.Seq
		s.mu.Lock()
		s.active[r.Seq] = a
		s.mu.Unlock()
		if d.retry != nil {
			d.retry.RecordExecution()
		}
		if d.waitObs != nil {
			d.waitObs.Observe(0)
		}
		go func() {
			defer s.deliveries.Done()
			s.deliverRecorded(a, *r)
		}()
		return Receipt{ID: id, Status: store.Running.String()}, true, nil
	}
	s.mu.Lock()
	s.adm.enqueueLocked(r)
	started = s.admitLocked(now)
	_, admitted := s.active[r.Seq]
	control := ""
	if v := s.adm.awaitLocked(r.Seq); v != nil {
		// Lanes shared through Redis are taken by a pass outside the lock:
		// answer with what it decided for this run.
		s.mu.Unlock()
		select {
		case <-v.done:
		case <-ctx.Done():
		}
		s.mu.Lock()
		admitted, control = v.admitted, v.control
	}
	rc := Receipt{ID: id, Status: store.Running.String()}
	if !admitted {
		if control == "" {
			control = s.controlLocked(s.q.def(r.Name), r.Key, now)
		}
		rc.Status, rc.AwaitingAdmission, rc.Control = store.Queued.String(), true, &control
	}
	s.mu.Unlock()
	s.launch(started)
	if rc.Control != nil {
		if c, ok := s.adm.storeControl(ctx, r.Name, r.Key, now); ok {
			// The shared queue's gates, not this sidecar's index, hold it.
			rc.Control = nil
			if c != "" {
				control = c
				rc.Control = &control
			}
		}
	}
	if rc.Control != nil && s.m != nil {
		s.m.Rejections.WithLabelValues(*rc.Control, "run:"+r.Name).Inc()
	}
	return rc, true, nil
}

// submitScheduled stores a run that waits until due before it joins the
// queue: SCHEDULED, its timer armed as a retry wait's is.
func (s *Scheduler) submitScheduled(ctx context.Context, r *store.Run, due time.Time) (Receipt, bool, error) {
	r.Status, r.RetryAt = store.Scheduled, due.UnixNano()
	created, err := s.st.Submit(ctx, r)
	if err != nil {
		return Receipt{}, false, fmt.Errorf("store run: %w", err)
	}
	if !created {
		v, err := s.view(ctx, r.Seq)
		return receiptOf(v), false, err
	}
	s.added(store.Scheduled)
	s.armRetry(r.Seq, r.RetryAt)
	return Receipt{ID: s.formatID(r.Seq), Status: store.Scheduled.String()}, true, nil
}

func unknownDefinition(cfg *config, name string) error {
	names := make([]string, 0, len(cfg.defs))
	for n := range cfg.defs {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return badRequest("unknown definition %q: scheduler.definitions is empty", name)
	}
	return badRequest("unknown definition %q; defined: %s", name, strings.Join(names, ", "))
}

// enterID admits an API call on the run id: ErrStopped while the
// scheduler is stopped, ErrNotFound for an id that cannot name a run. The
// caller calls s.leave when err is nil.
func (s *Scheduler) enterID(id string) (uint64, error) {
	if !s.enter() {
		return 0, ErrStopped
	}
	seq, ok := s.parseID(id)
	if !ok {
		s.leave()
		return 0, ErrNotFound
	}
	return seq, nil
}

// Get returns a run.
func (s *Scheduler) Get(ctx context.Context, id string) (RunView, error) {
	seq, err := s.enterID(id)
	if err != nil {
		return RunView{}, err
	}
	defer s.leave()
	return s.view(ctx, seq)
}

func (s *Scheduler) view(ctx context.Context, seq uint64) (RunView, error) {
	if s.npending.Load() > 0 {
		s.mu.Lock()
		pv, ok := s.pendingViewLocked(seq, s.clk.Now())
		s.mu.Unlock()
		if ok {
			return pv, nil // what the store will say once it takes the write
		}
	}
	r, err := s.st.Get(ctx, seq)
	if errors.Is(err, store.ErrNotFound) {
		return RunView{}, ErrNotFound
	}
	if err != nil {
		return RunView{}, fmt.Errorf("load run: %w", err)
	}
	now := s.clk.Now()
	s.mu.Lock()
	v := []RunView{s.viewLocked(r, now)}
	s.mu.Unlock()
	s.storeControls(ctx, v, now)
	return v[0], nil
}

// List returns runs in id order, optionally of one status (the API's
// names; RUNNING includes runs being started), of one definition, of one
// key, after id after.
func (s *Scheduler) List(ctx context.Context, f ListFilter) ([]RunView, error) {
	if !s.enter() {
		return nil, ErrStopped
	}
	defer s.leave()
	var sts []store.Status
	if f.Status != "" {
		st, ok := store.ParseStatus(f.Status)
		if !ok || st == store.Starting {
			names := make([]string, 0, len(store.All))
			for _, x := range store.All {
				if x != store.Starting {
					names = append(names, x.String())
				}
			}
			return nil, badRequest("unknown status %q; want one of %s", f.Status, strings.Join(names, ", "))
		}
		sts = append(sts, st)
		if st == store.Running {
			sts = append(sts, store.Starting)
		}
	}
	if len(sts) == 0 {
		sts = []store.Status{0} // any
	}
	var runs []store.Run
	q := store.Query{Name: f.Name, Key: f.Key, After: f.After, Limit: f.Limit}
	for _, st := range sts {
		q.Status = st
		part, err := s.st.List(ctx, q)
		if err != nil {
			return nil, err
		}
		runs = append(runs, part...)
	}
	slices.SortFunc(runs, func(a, b store.Run) int {
		switch {
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		}
		return 0
	})
	if f.Limit > 0 && len(runs) > f.Limit {
		runs = runs[:f.Limit]
	}
	now := s.clk.Now()
	out := make([]RunView, 0, len(runs))
	s.mu.Lock()
	for _, r := range runs {
		out = append(out, s.viewLocked(r, now))
	}
	s.mu.Unlock()
	s.storeControls(ctx, out, now)
	return out, nil
}

// ListFilter selects the runs List returns; zero fields select all.
type ListFilter struct {
	Status string // an API status name
	Name   string // a definition
	Key    string // a resolved key (key_concurrency's)
	After  uint64 // runs with a later id
	Limit  int
}

// Completion is what a worker reports for a run it accepted with 202.
type Completion struct {
	Status string // COMPLETED, FAILED or FAILED_WITH_TERMINAL_ERROR
	Output []byte // raw JSON
	Reason string
}

// Complete ends a RUNNING run as the worker reports. FAILED is retried per
// the definition's retry policy; FAILED_WITH_TERMINAL_ERROR never is.
func (s *Scheduler) Complete(ctx context.Context, id string, c Completion) (RunView, error) {
	if !s.enter() {
		return RunView{}, ErrStopped
	}
	defer s.leave()
	a, err := s.activeRun(ctx, id, "complete")
	if err != nil {
		return RunView{}, err
	}
	var ok bool
	switch c.Status {
	case "COMPLETED":
		ok = s.finish(a, store.Completed, c.Output, "", "")
	case "FAILED_WITH_TERMINAL_ERROR":
		ok = s.finish(a, store.FailedTerminal, nil, c.Reason, "")
	case "FAILED":
		reason := c.Reason
		if reason == "" {
			reason = "worker reported FAILED"
		}
		ok = s.fail(a, reason, 0)
	default:
		return RunView{}, badRequest(`"status" %q: want COMPLETED, FAILED or FAILED_WITH_TERMINAL_ERROR`, c.Status)
	}
	v, err := s.view(ctx, a.seq)
	if err == nil && !ok {
		return v, &Conflict{Msg: fmt.Sprintf("run %s is already %s", id, v.Status)}
	}
	return v, err
}

// Heartbeat renews a RUNNING run: its heartbeat_timeout restarts and its
// semaphore permits' lease is extended.
func (s *Scheduler) Heartbeat(ctx context.Context, id string) (RunView, error) {
	if !s.enter() {
		return RunView{}, ErrStopped
	}
	defer s.leave()
	a, err := s.activeRun(ctx, id, "heartbeat")
	if err != nil {
		return RunView{}, err
	}
	now := s.clk.Now().UnixNano()
	a.mu.Lock()
	done, async := a.done, a.phase == phaseAsync
	if !done {
		a.heartbeatAt = now
		s.armRunTimer(a)
	}
	a.mu.Unlock()
	if !done && async {
		s.adm.leasePermits(a, now+int64(a.leaseTerm()))
	}
	v, err := s.view(ctx, a.seq)
	if err == nil && done {
		return v, &Conflict{Msg: fmt.Sprintf("run %s is %s; heartbeats renew only a RUNNING run", id, v.Status)}
	}
	return v, err
}

// activeRun finds an admitted run for complete or heartbeat.
func (s *Scheduler) activeRun(ctx context.Context, id, what string) (*active, error) {
	seq, ok := s.parseID(id)
	if !ok {
		return nil, ErrNotFound
	}
	s.mu.Lock()
	a := s.active[seq]
	s.mu.Unlock()
	if a != nil && a.getPhase() != phaseAdmitted {
		return a, nil
	}
	v, err := s.view(ctx, seq)
	if err != nil {
		return nil, err
	}
	if v.Status == store.Running.String() && a == nil {
		if err := s.adm.heldElsewhere(id, what); err != nil {
			return nil, err
		}
	}
	return nil, &Conflict{Msg: fmt.Sprintf("run %s is %s: only a RUNNING run can %s", id, v.Status, what)}
}

// viewLocked renders a stored run, naming the control that holds it when
// it waits.
func (s *Scheduler) viewLocked(r store.Run, now time.Time) RunView {
	v := RunView{
		ID: s.formatID(r.Seq), Name: r.Name, Status: apiStatus(r.Status), Attempt: int(r.Attempt),
		Priority: int(r.Priority), Key: r.Key,
		CreatedAt: ts(r.CreatedAt), StartedAt: ts(r.StartedAt), FinishedAt: ts(r.FinishedAt),
	}
	switch r.Status {
	case store.RetryWait:
		v.RetryAt = ts(r.RetryAt)
	case store.Scheduled:
		v.NotBefore = ts(r.RetryAt)
	}
	if r.Reason != "" {
		reason := r.Reason
		v.ReasonForIncompletion = &reason
	}
	if r.Output != nil {
		if json.Valid(r.Output) {
			v.Output = r.Output
		} else {
			v.Output, _ = json.Marshal(string(r.Output))
		}
	}
	control := r.Control
	if r.Status == store.Queued {
		if _, admitted := s.active[r.Seq]; admitted {
			// Admitted; its STARTING record is on its way. Show it as
			// that record will read: the attempt that failed before is
			// no longer the run's reason (store.Run.admit clears it).
			v.Status, v.Attempt, control = store.Running.String(), v.Attempt+1, ""
			v.ReasonForIncompletion = nil
		} else {
			v.AwaitingAdmission = true
			control = s.controlLocked(s.q.def(r.Name), r.Key, now)
		}
	}
	if control != "" {
		v.Control = &control
	}
	return v
}

// storeControls fills in the control of every waiting run of views from
// the store when the store holds the queue (admitter.storeControl), one
// read per definition and key.
func (s *Scheduler) storeControls(ctx context.Context, views []RunView, now time.Time) {
	type nk struct{ name, key string }
	var seen map[nk]string
	for i := range views {
		v := &views[i]
		if !v.AwaitingAdmission {
			continue
		}
		k := nk{v.Name, v.Key}
		c, ok := seen[k]
		if !ok {
			var fromStore bool
			if c, fromStore = s.adm.storeControl(ctx, v.Name, v.Key, now); !fromStore {
				return // named by viewLocked already
			}
			if seen == nil {
				seen = map[nk]string{}
			}
			seen[k] = c
		}
		if c == "" {
			v.Control = nil
			continue
		}
		v.Control = &c
	}
}

func ts(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}
