package bridge

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/proxy/bridge/dbpool"
)

// Reap reasons: the `reason` label of warden_bridge_reaped_total and the
// keys of "reaped" in /v1/bridges.
const (
	ReasonClientGone        = "client_gone"
	ReasonIdle              = dbpool.ReasonIdle
	ReasonIdleInTransaction = "idle_in_transaction"
	ReasonMaxLifetime       = dbpool.ReasonMaxLifetime
	ReasonRunEnded          = "run_ended"
)

// Reasons lists every reap reason in a stable order.
var Reasons = []string{ReasonClientGone, ReasonIdle, ReasonIdleInTransaction, ReasonMaxLifetime, ReasonRunEnded}

// cause is why a session ended. The first one set wins.
type cause int32

const (
	causeNone           cause = iota
	causeClientDone           // the client left cleanly (Terminate; EOF on tcp)
	causeReuse                // Terminate while idle: the upstream connection is kept
	causeServerClosed         // the upstream ended the session
	causeClientProtocol       // the client broke the protocol after startup
	causeServerProtocol       // the upstream broke the protocol
	causeLoginChanged         // a cached login that the server now challenges
	causeClientGone           // reaped: the client vanished
	causeIdle                 // reaped: idle_timeout
	causeIdleInTx             // reaped: idle_in_transaction_timeout
	causeMaxLifetime          // reaped: max_lifetime, once idle
	causeRunEnded             // reaped: the bound run reached a final state
	causeRemoved              // the bridge left the policy
	causeShutdown             // warden is shutting down
	causeLoginTimeout         // the upstream did not finish a new connection's login in time
)

// reapReason is the reason a cause is counted under ("" if it is no reap).
func (c cause) reapReason() string {
	switch c {
	case causeClientGone:
		return ReasonClientGone
	case causeIdle:
		return ReasonIdle
	case causeIdleInTx:
		return ReasonIdleInTransaction
	case causeMaxLifetime:
		return ReasonMaxLifetime
	case causeRunEnded:
		return ReasonRunEnded
	}
	return ""
}

// abandonsStatement reports whether a session ended for c, in the middle of
// a statement, leaves that statement running on the server for nobody:
// closing the connection does not stop it (the server notices only when it
// next writes), so it would hold its locks, and an autocommit statement
// would commit for a client or run that is gone. The server ending the
// session, or a client that terminated itself, leaves nothing to stop.
func (c cause) abandonsStatement() bool {
	switch c {
	case causeNone, causeClientDone, causeReuse, causeServerClosed, causeServerProtocol, causeLoginTimeout:
		return false
	}
	return true
}

// farewell is the ErrorResponse a Postgres client is sent when the bridge
// ends its session for cause c, nil when it is owed none.
func (s *session) farewell(c cause) []byte {
	name, cfg := s.b.name, &s.g.cfg
	switch c {
	case causeIdle:
		return fatal("57P05", fmt.Sprintf("terminating connection due to idle-session timeout (bridge %s, idle_timeout %s)", name, cfg.IdleTimeout), "")
	case causeIdleInTx:
		return fatal("25P03", fmt.Sprintf("terminating connection due to idle-in-transaction timeout (bridge %s, idle_in_transaction_timeout %s); the transaction was rolled back", name, cfg.IdleInTransactionTimeout), "")
	case causeMaxLifetime:
		return fatal("57P01", fmt.Sprintf("terminating connection: bridge %s max_lifetime %s reached", name, cfg.MaxLifetime), "")
	case causeRunEnded:
		return fatal("57P01", fmt.Sprintf("terminating connection: run %s has ended (bridge %s)", s.runID, name), "")
	case causeRemoved:
		return fatal("57P01", fmt.Sprintf("terminating connection: bridge %s was removed from the policy", name), "")
	case causeShutdown:
		return fatal("57P01", fmt.Sprintf("terminating connection: warden is shutting down (bridge %s)", name), "")
	case causeLoginChanged:
		return fatal("28000", fmt.Sprintf("bridge %s: %v; reconnect", name, s.detail()), "")
	case causeClientProtocol:
		return fatal("08P01", fmt.Sprintf("bridge %s: protocol violation: %v", name, s.detail()), "")
	case causeServerProtocol:
		return fatal("08P01", fmt.Sprintf("bridge %s: upstream protocol violation: %v", name, s.detail()), "")
	case causeLoginTimeout:
		return fatal("08006", fmt.Sprintf("bridge %s: the server at %s did not complete the login within %s", name, cfg.Upstream, s.b.set.opts.StartupTimeout), "")
	}
	return nil
}

// fatal encodes a FATAL ErrorResponse.
func fatal(code, msg, detail string) []byte {
	b, err := (&pgproto3.ErrorResponse{
		Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: msg, Detail: detail,
	}).Encode(nil)
	if err != nil {
		// Only over-long messages fail to encode, and ours are short.
		panic(fmt.Sprintf("encode ErrorResponse: %v", err))
	}
	return b
}

// waitRefusal is the 53300 a client gets after waiting wait_timeout.
func waitRefusal(name string, max int, waited time.Duration) []byte {
	return fatal("53300", fmt.Sprintf("bridge %s: no connection free after waiting %s (max_connections %d)",
		name, waited.Round(time.Millisecond), max), "control: "+string(control.BridgeConnections))
}
