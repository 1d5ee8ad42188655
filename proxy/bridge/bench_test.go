package bridge

import (
	"bufio"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/policy"
)

// The round-trip benchmarks time one simple query through the bridge and,
// as the baseline, straight to the same server: a loopback backend that
// answers every Query with a canned one-row result, so that only the
// bridge's own cost differs. allocs/op counts the whole process (client,
// bridge and backend); the backend and client allocate nothing per query.

func BenchmarkRoundTripDirect(b *testing.B) {
	addr := cannedBackend(b)
	roundTrips(b, addr)
}

func BenchmarkRoundTripBridge(b *testing.B) {
	addr := cannedBackend(b)
	s := New(Options{Clock: clock.Real{}})
	defer s.Shutdown(b.Context())
	cfg := policy.Bridge{Name: "bench", Listen: "127.0.0.1:0", Upstream: addr, Protocol: policy.ProtocolPostgres,
		MaxConnections: 64, WaitTimeout: time.Minute, IdleTimeout: time.Hour}
	if err := s.Apply(b.Context(), controls(cfg)); err != nil {
		b.Fatal(err)
	}
	s.mu.Lock()
	br := s.bridges["bench"]
	s.mu.Unlock()
	br.mu.Lock()
	listen := br.ln.Addr().String()
	br.mu.Unlock()
	roundTrips(b, listen)
}

// roundTrips logs in one client per parallel worker and runs b.N queries.
func roundTrips(b *testing.B, addr string) {
	query, _ := (&pgproto3.Query{String: "SELECT 1"}).Encode(nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		r := bufio.NewReaderSize(c, 4096)
		startup, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
			Parameters: map[string]string{"user": "bench", "database": "bench"}}).Encode(nil)
		if _, err := c.Write(startup); err != nil || !untilReady(r) {
			b.Error("login failed")
			return
		}
		for pb.Next() {
			if _, err := c.Write(query); err != nil || !untilReady(r) {
				b.Error("query failed")
				return
			}
		}
		terminate, _ := (&pgproto3.Terminate{}).Encode(nil)
		_, _ = c.Write(terminate)
	})
}

// untilReady skips server messages up to and including ReadyForQuery.
func untilReady(r *bufio.Reader) bool {
	for {
		hdr, err := r.Peek(5)
		if err != nil {
			return false
		}
		typ, n := hdr[0], int(binary.BigEndian.Uint32(hdr[1:]))
		if _, err := r.Discard(1 + n); err != nil {
			return false
		}
		if typ == 'Z' {
			return true
		}
	}
}

// cannedBackend is a loopback server speaking just enough of the protocol:
// a trust login, and a fixed result for every Query.
func cannedBackend(b *testing.B) string {
	b.Helper()
	login := encode(b, &pgproto3.AuthenticationOk{}, &pgproto3.ParameterStatus{Name: "server_version", Value: "15"},
		&pgproto3.BackendKeyData{ProcessID: 7, SecretKey: []byte{1, 2, 3, 4}}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	result := encode(b, &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("x"), DataTypeOID: 23, DataTypeSize: 4, Format: 0}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("1")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	discard := encode(b, &pgproto3.CommandComplete{CommandTag: []byte("DISCARD ALL")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	return loopback.Serve(b, func(c net.Conn) {
		if _, err := readStartupPacket(c); err != nil {
			return
		}
		if _, err := c.Write(login); err != nil {
			return
		}
		r := bufio.NewReaderSize(c, 4096)
		for {
			hdr, err := r.Peek(5)
			if err != nil {
				return
			}
			typ, n := hdr[0], int(binary.BigEndian.Uint32(hdr[1:]))
			body, err := r.Peek(1 + n)
			if err != nil {
				return
			}
			reply := result
			if typ == 'Q' && string(body[5:len(body)-1]) == "DISCARD ALL" {
				reply = discard
			}
			if _, err := r.Discard(1 + n); err != nil || typ == 'X' {
				return
			}
			if _, err := c.Write(reply); err != nil {
				return
			}
		}
	})
}

func controls(bs ...policy.Bridge) *governor.Controls {
	return &governor.Controls{Policy: &policy.Policy{Bridges: bs}}
}
