// Package store keeps scheduler runs durably. The Store interface is the
// seam between the scheduler and where runs live: the embedded bbolt file in
// --data-dir (the default), an in-memory map for tests and benchmarks, and
// a Postgres table shared by several sidecars (package pgstore).
//
// Every state change of a run is one store operation: Submit creates a run
// (QUEUED, or STARTING when it is admitted at once), Start records an
// admission (QUEUED → STARTING with the pool window its rate slot was
// counted in), and Update moves a run from one of the statuses it is
// expected to be in to its next state — each a compare-and-set on the
// status, durable when it returns. The scheduler decides admissions in
// process and records each as it delivers (AsyncStarter: the STARTING
// write is queued before the delivery and lands within one group commit),
// so a restart can tell which runs were caught between admission and
// delivery.
//
// The seam for a shared store (Postgres, several sidecars): each operation
// maps to one statement (INSERT … ON CONFLICT for idempotency keys, UPDATE …
// WHERE status = ANY($from) RETURNING), so the in-process admitter can work
// over it unchanged while lanes and semaphores stay per sidecar. To share
// the admission decision too, the Postgres store adds a claim operation
// (pgstore.Store.Claim) — SELECT the next admissible runs FOR UPDATE SKIP
// LOCKED, checking the gates in the same transaction, and return them
// already STARTING — which the scheduler then delivers exactly as it
// delivers what its own admitter picked (scheduler/admit_postgres.go).
package store

import (
	"context"
	"errors"
	"time"
)

// Status is where a run is in its life.
type Status uint8

// Statuses. STARTING is the store's record of an admission whose delivery
// has not been acknowledged by the worker; the API shows it as RUNNING.
const (
	Queued Status = iota + 1
	Starting
	Running
	RetryWait
	Completed
	Failed
	FailedTerminal
	TimedOut
	Cancelled
	// Scheduled waits for its not_before time (RetryAt), then joins the
	// queue. It comes after the terminal statuses only because statuses
	// are stored by number.
	Scheduled
	maxStatus = Scheduled
)

var statusNames = [...]string{
	Queued: "QUEUED", Starting: "STARTING", Running: "RUNNING", RetryWait: "RETRY_WAIT",
	Completed: "COMPLETED", Failed: "FAILED", FailedTerminal: "FAILED_WITH_TERMINAL_ERROR", TimedOut: "TIMED_OUT",
	Cancelled: "CANCELLED", Scheduled: "SCHEDULED",
}

func (s Status) String() string {
	if s == 0 || s > maxStatus {
		return "UNKNOWN"
	}
	return statusNames[s]
}

// ParseStatus reads a status name as String writes it.
func ParseStatus(name string) (Status, bool) {
	for s := Queued; s <= maxStatus; s++ {
		if statusNames[s] == name {
			return s, true
		}
	}
	return 0, false
}

// Terminal reports whether the run has ended for good.
func (s Status) Terminal() bool { return s >= Completed && s <= Cancelled }

// Unfinished lists the statuses a restart must look at, in the order
// Store.Unfinished visits them.
var Unfinished = []Status{Queued, Starting, Running, RetryWait, Scheduled}

// All lists every status.
var All = []Status{Scheduled, Queued, Starting, Running, RetryWait, Completed, Failed, FailedTerminal, TimedOut, Cancelled}

// Statuses is a set of statuses, the expected current status of an Update.
type Statuses uint16

// Of makes a set.
func Of(ss ...Status) Statuses {
	var m Statuses
	for _, s := range ss {
		m |= 1 << s
	}
	return m
}

// Has reports whether s is in the set.
func (m Statuses) Has(s Status) bool { return m&(1<<s) != 0 }

// Run is one run as stored. Times are unix nanoseconds, 0 when unset, so a
// million queued runs decode without a time.Time each.
type Run struct {
	Seq            uint64 // assigned by Submit; the run's identity and age
	Name           string // definition
	Status         Status
	Priority       int32
	Attempt        int32 // deliveries made so far; the current one while STARTING/RUNNING
	Key            string
	Tenant         string
	IdempotencyKey string
	Input          []byte
	Output         []byte
	Reason         string // reason_for_incompletion of the last failure; cleared by the next admission
	Control        string // the control that ended or delayed the run (timeout, retry_budget)
	CreatedAt      int64
	QueuedAt       int64 // when it last entered the queue (creation or the end of a retry wait)
	StartedAt      int64 // when the current or last attempt was admitted
	FinishedAt     int64
	RetryAt        int64  // RETRY_WAIT: when it goes back to the queue; SCHEDULED: its not_before
	PoolID         string // pool whose rate slot the current admission took
	WindowStart    int64  // start of that slot's window; 0 when no slot was taken
}

// Time converts a stored timestamp; the zero time for 0.
func Time(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Errors a store reports.
var (
	ErrNotFound = errors.New("run not found")
	// ErrConflict: the run is not in a status the update expected; another
	// transition (a timeout, a complete call) got there first.
	ErrConflict = errors.New("run changed status concurrently")
	ErrClosed   = errors.New("store closed")
)

// Admission is what Start records.
type Admission struct {
	At          int64 // unix nanos
	PoolID      string
	WindowStart int64 // 0: no rate slot taken
}

// admit applies an admission to a QUEUED run, returning the RetryAt it had.
func (r *Run) admit(a Admission) int64 {
	retryAt := r.RetryAt
	r.Status = Starting
	r.Attempt++
	r.StartedAt = a.At
	r.PoolID, r.WindowStart = a.PoolID, a.WindowStart
	// The failure that sent it back to the queue is the previous
	// attempt's: a running attempt has no reason for incompletion.
	r.RetryAt, r.Control, r.Output, r.Reason = 0, "", nil, ""
	return retryAt
}

// AsyncStarter is implemented by stores whose Start can be queued rather
// than waited for (the bbolt store's group commit). A freed lane then
// hands the next run to the worker at once instead of one fsync later.
type AsyncStarter interface {
	// StartAsync records an admission as Start does but returns once the
	// write is queued, with the run as it will be recorded (RetryAt as it
	// was while QUEUED). done is called with the write's outcome, on the
	// store's committer: it must not block. Writes of the run made after
	// StartAsync returns are applied after this one.
	StartAsync(ctx context.Context, seq uint64, a Admission, done func(error)) (Run, error)
}

// Query selects runs for List.
type Query struct {
	Status Status // 0: any
	Name   string // definition; "": any
	Key    string // resolved key; "": any
	After  uint64 // runs with Seq > After
	Limit  int
}

// endedBefore reports whether r is a finished run that ended before t:
// what Purge deletes.
func (r *Run) endedBefore(t int64) bool { return r.Status.Terminal() && r.FinishedAt < t }

// Matches reports whether r passes q's name and key filters.
func (q Query) Matches(r *Run) bool {
	return (q.Name == "" || r.Name == q.Name) && (q.Key == "" || r.Key == q.Key)
}

// Store keeps runs. Methods are safe for concurrent use; Submit and Update
// are durable when they return nil.
type Store interface {
	// Submit stores r as a new run in r.Status (QUEUED) and sets r.Seq. When
	// r.IdempotencyKey is set and a run of the same definition already has
	// that key, r is overwritten with the existing run, nothing is written and
	// created is false. The store keeps r's byte slices; the caller must not
	// modify them afterwards.
	Submit(ctx context.Context, r *Run) (created bool, err error)
	// Get returns the run with sequence seq or ErrNotFound.
	Get(ctx context.Context, seq uint64) (Run, error)
	// List returns runs matching q in Seq order.
	List(ctx context.Context, q Query) ([]Run, error)
	// Update replaces the stored run r.Seq with r if its stored status is in
	// from; otherwise ErrConflict (ErrNotFound for an unknown run).
	Update(ctx context.Context, r *Run, from Statuses) error
	// Start records an admission: a QUEUED run becomes STARTING for its
	// next attempt (Attempt+1, StartedAt, the pool window of its rate slot;
	// RetryAt, Control, Output and Reason cleared) and is returned whole, in one
	// operation. The returned RetryAt is the value it had while QUEUED:
	// non-zero when the run came back from a retry wait. ErrConflict when
	// the run is not QUEUED.
	Start(ctx context.Context, seq uint64, a Admission) (Run, error)
	// Unfinished calls fn for every run in a status of Unfinished, status by
	// status in that order and by Seq within one, without Input and Output
	// (Get loads them). fn must not call the store.
	Unfinished(ctx context.Context, fn func(*Run) error) error
	// Counts returns how many runs are in each status.
	Counts(ctx context.Context) (map[Status]int, error)
	// Purge deletes at most limit runs that ended (a terminal status)
	// before the unix-nanosecond time before, with their idempotency keys,
	// and returns how many it deleted of each status. Unfinished runs are
	// never deleted, however old. A store may stop looking at the first
	// run created at or after before (none after it can have ended before
	// it), so fewer than limit deleted means nothing is left to purge.
	Purge(ctx context.Context, before int64, limit int) (map[Status]int, error)
	// Close flushes pending writes and releases the store.
	Close() error
}
