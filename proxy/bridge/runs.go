package bridge

import (
	"errors"
	"strings"
)

// RunTracker tells the bridge when a scheduler run reaches a final state.
// The scheduler implements it; without one, sessions are not bound to runs.
type RunTracker interface {
	// Done returns a channel that is closed once the run reaches a final
	// state (already closed if it has). known is false if there is no run
	// with this id.
	Done(runID string) (ended <-chan struct{}, known bool)
}

// runPrefix marks an application_name that binds a session to a run.
const runPrefix = "run:"

// errRunEnded refuses a client whose run has already ended.
var errRunEnded = errors.New("run ended")

// runOf is the run a Postgres client binds itself to ("" if none).
func runOf(params map[string]string) string {
	id, ok := strings.CutPrefix(params["application_name"], runPrefix)
	if !ok {
		return ""
	}
	return id
}

// bindRun resolves a session's run: the channel that closes when it ends,
// nil when the session is not bound (no run named, no tracker, or a run the
// tracker does not know), errRunEnded when it has already ended.
func (b *bridge) bindRun(runID string) (<-chan struct{}, error) {
	if runID == "" || b.set.opts.Runs == nil {
		return nil, nil
	}
	ended, known := b.set.opts.Runs.Done(runID)
	if !known {
		b.log.Warn("client names an unknown run; session not bound", "run", runID)
		return nil, nil
	}
	select {
	case <-ended:
		return nil, errRunEnded
	default:
		return ended, nil
	}
}
