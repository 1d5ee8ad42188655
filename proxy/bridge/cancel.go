package bridge

import (
	"crypto/rand"
	"encoding/binary"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Each client is given a cancel key of the bridge's own instead of the
// server's: a kept connection is lent to one client after another, and the
// previous client must not be able to cancel the next one's queries. A
// CancelRequest is forwarded to the upstream only when its key belongs to a
// live session of this bridge, rewritten to that connection's real key.
// A cancel still on its way when its client terminates would reach the
// server connection's next user: that connection is closed, not kept, as
// PgBouncer holds one back until its cancels are done.

// cancelTarget is where a client's cancel key leads.
type cancelTarget struct {
	addr string
	real atomic.Pointer[serverKey] // nil until the client has a server connection

	mu       sync.Mutex
	ended    bool // the session is over: nothing more is forwarded
	inflight int  // cancels being forwarded
}

// begin is a forwarded cancel's start: the server connection's key, or nil
// when the session is over or has none.
func (t *cancelTarget) begin() *serverKey {
	t.mu.Lock()
	defer t.mu.Unlock()
	real := t.real.Load()
	if t.ended || real == nil {
		return nil
	}
	t.inflight++
	return real
}

func (t *cancelTarget) finished() {
	t.mu.Lock()
	t.inflight--
	t.mu.Unlock()
}

// end closes the key to cancels and reports whether one is still being
// forwarded (its server connection must then not serve anyone else).
func (t *cancelTarget) end() (busy bool) {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	return t.inflight > 0
}

// serverKey is a server connection's own BackendKeyData.
type serverKey struct {
	pid    uint32
	secret []byte
}

func cancelKey(pid uint32, secret []byte) string {
	k := make([]byte, 4, 4+len(secret))
	binary.BigEndian.PutUint32(k, pid)
	return string(append(k, secret...))
}

// issueCancelKey appends a BackendKeyData with a fresh key (its secret as
// long as the client's protocol expects) and publishes where it leads.
func (b *bridge) issueCancelKey(out []byte, secretLen int, addr string) ([]byte, string, *cancelTarget) {
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	fake := pgproto3.BackendKeyData{
		ProcessID: binary.BigEndian.Uint32(seed[:])&0x7fffffff | 1, // a plausible, non-zero pid
		SecretKey: make([]byte, secretLen),
	}
	_, _ = rand.Read(fake.SecretKey)
	out, _ = fake.Encode(out)
	key, t := cancelKey(fake.ProcessID, fake.SecretKey), &cancelTarget{addr: addr}
	b.mu.Lock()
	b.cancels[key] = t
	b.mu.Unlock()
	return out, key, t
}

func (b *bridge) withdrawCancelKey(key string) {
	if key == "" {
		return
	}
	b.mu.Lock()
	delete(b.cancels, key)
	b.mu.Unlock()
}

// cancelWait bounds how long a forwarded cancel waits for the server to
// acknowledge it by closing the connection.
const cancelWait = 5 * time.Second

// forwardCancel sends a client's CancelRequest to the server connection its
// key leads to, and drops it when the key is unknown.
func (b *bridge) forwardCancel(m *pgproto3.CancelRequest) {
	b.mu.Lock()
	t := b.cancels[cancelKey(m.ProcessID, m.SecretKey)]
	b.mu.Unlock()
	var real *serverKey
	if t != nil {
		real = t.begin()
	}
	if real == nil {
		b.log.Debug("cancel request for no live server connection dropped")
		return
	}
	defer t.finished()
	b.sendCancel(t.addr, real)
}

// sendCancel asks the server at addr to cancel what the connection with
// key is running, and waits until it has acted.
func (b *bridge) sendCancel(addr string, key *serverKey) {
	conn, err := b.set.dialer.Dial("tcp", addr)
	if err != nil {
		b.log.Warn("cancel request not forwarded", "upstream", addr, "err", err)
		return
	}
	defer conn.Close()
	req, err := (&pgproto3.CancelRequest{ProcessID: key.pid, SecretKey: key.secret}).Encode(nil)
	if err != nil {
		return
	}
	if _, err := conn.Write(req); err != nil {
		b.log.Warn("cancel request not forwarded", "upstream", addr, "err", err)
		return
	}
	// The server closes the connection once it has acted on the request.
	_ = conn.SetReadDeadline(time.Now().Add(cancelWait))
	_, _ = io.Copy(io.Discard, conn)
}
