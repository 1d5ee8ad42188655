package bridge

import (
	"bytes"
	"encoding/binary"
	"maps"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func encode(t testing.TB, msgs ...interface{ Encode([]byte) ([]byte, error) }) []byte {
	t.Helper()
	var out []byte
	for _, m := range msgs {
		var err error
		if out, err = m.Encode(out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// scanSplit feeds p to a fresh scanner in pieces cut at every cut point.
func frontendSplit(p []byte, cuts ...int) (rfq, term int, err error) {
	var s frontendScanner
	term = noTerminate
	prev := 0
	for _, c := range append(cuts, len(p)) {
		r, tm, e := s.scan(p[prev:c])
		rfq += r
		if tm >= 0 {
			term = prev + tm
		} else if tm == terminateSplit {
			term = tm
		}
		if e != nil {
			return rfq, term, e
		}
		prev = c
	}
	return rfq, term, nil
}

func TestFrontendScanner(t *testing.T) {
	parse := &pgproto3.Parse{Query: "select $1"}
	bind := &pgproto3.Bind{}
	exec := &pgproto3.Execute{}
	sync := &pgproto3.Sync{}
	cases := []struct {
		name string
		p    []byte
		rfq  int
		term int
	}{
		{"simple query", encode(t, &pgproto3.Query{String: "select 1"}), 1, noTerminate},
		{"extended", encode(t, parse, bind, &pgproto3.Describe{ObjectType: 'P'}, exec, sync), 1, noTerminate},
		{"pipeline of three", encode(t, bind, exec, sync, bind, exec, sync, bind, exec, sync), 3, noTerminate},
		// A request sent with Flush and no Sync yet is running: it awaits
		// the ReadyForQuery of its Sync, and the Sync adds no other.
		{"flush only", encode(t, &pgproto3.Flush{}), 1, noTerminate},
		{"execute and flush", encode(t, parse, bind, exec, &pgproto3.Flush{}), 1, noTerminate},
		{"execute, flush, then sync", encode(t, parse, bind, exec, &pgproto3.Flush{}, sync), 1, noTerminate},
		{"describe and close", encode(t, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Close{ObjectType: 'S'}, sync), 1, noTerminate},
		{"pipeline with an unsynced tail", encode(t, bind, exec, sync, bind, exec, &pgproto3.Flush{}), 2, noTerminate},
		{"function call", encode(t, &pgproto3.FunctionCall{Function: 1}), 1, noTerminate},
		// libpq's extended-protocol COPY FROM STDIN: the Sync sent with
		// Execute is ignored by the server inside COPY IN.
		{"extended copy in", encode(t, parse, bind, exec, sync,
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.CopyDone{}, sync), 1, noTerminate},
		{"extended copy in sent with flush", encode(t, parse, bind, exec, &pgproto3.Flush{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, sync), 1, noTerminate},
		{"simple copy in", encode(t, &pgproto3.Query{String: "copy t from stdin"},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "no"}), 1, noTerminate},
		{"terminate", encode(t, &pgproto3.Query{String: "select 1"}, &pgproto3.Terminate{}), 1, 14},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for cut := 0; cut <= len(tc.p); cut++ {
				rfq, term, err := frontendSplit(tc.p, cut)
				if err != nil {
					t.Fatalf("cut %d: %v", cut, err)
				}
				wantTerm := tc.term
				if wantTerm >= 0 && cut > wantTerm && cut < wantTerm+5 {
					wantTerm = terminateSplit // the header straddles the cut
				}
				if rfq != tc.rfq || term != wantTerm {
					t.Fatalf("cut %d: rfq %d term %d, want %d %d", cut, rfq, term, tc.rfq, wantTerm)
				}
				// Every case is one request or more, with no ReadyForQuery
				// received: from its first header on, the client awaits
				// one, so the session is busy (never idle mid-request).
				if cut >= 5 {
					if busy, _, _ := frontendSplit(tc.p[:cut]); busy < 1 {
						t.Fatalf("after %d bytes: %d ReadyForQuery awaited, the session would count as idle", cut, busy)
					}
				}
			}
		})
	}
}

func TestBackendScanner(t *testing.T) {
	stream := encode(t,
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("x")}}},
		&pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte("v"), 100)}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'T'},
		&pgproto3.NoticeResponse{Message: "hi"},
		&pgproto3.ReadyForQuery{TxStatus: 'E'},
	)
	for a := 0; a <= len(stream); a++ {
		for _, b := range []int{a, min(a+1, len(stream)), min(a+5, len(stream)), len(stream)} {
			var s backendScanner
			total, last := 0, byte(0)
			for _, piece := range [][]byte{stream[:a], stream[a:b], stream[b:]} {
				rfq, st, err := s.scan(piece)
				if err != nil {
					t.Fatalf("cuts %d,%d: %v", a, b, err)
				}
				total += rfq
				if rfq > 0 {
					last = st
				}
			}
			if total != 2 || last != 'E' || !s.atBoundary() {
				t.Fatalf("cuts %d,%d: rfq %d last %c boundary %v", a, b, total, last, s.atBoundary())
			}
		}
	}
	bad := [][]byte{
		{'Z', 0, 0, 0, 6, 'I', 'I'}, // ReadyForQuery of the wrong length
		{'Z', 0, 0, 0, 5, 'X'},      // unknown status
		{'?', 0, 0, 0, 4},           // unknown type
		{'D', 0, 0, 0, 3},           // length below 4
	}
	for _, p := range bad {
		var s backendScanner
		if _, _, err := s.scan(p); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}

// The backend scanner notices an ErrorResponse after which the server
// closes the session, however the stream is cut into reads.
func TestBackendScannerSeesFatal(t *testing.T) {
	cases := []struct {
		name   string
		msg    interface{ Encode([]byte) ([]byte, error) }
		ending bool
	}{
		{"FATAL", &pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{"PANIC", &pgproto3.ErrorResponse{Severity: "PANIC", SeverityUnlocalized: "PANIC", Code: "XX000"}, true},
		{"translated FATAL", &pgproto3.ErrorResponse{Severity: "SCHWERWIEGEND", SeverityUnlocalized: "FATAL", Code: "57P01"}, true},
		{"FATAL before 9.6 (no V field)", &pgproto3.ErrorResponse{Severity: "FATAL", Code: "57P01"}, true},
		{"ERROR", &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42P01", Message: strings.Repeat("x", 100)}, false},
		{"translated ERROR", &pgproto3.ErrorResponse{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "42P01"}, false},
		{"FATAL notice text", &pgproto3.NoticeResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stream := encode(t, &pgproto3.ReadyForQuery{TxStatus: 'I'}, tc.msg)
			for a := 0; a <= len(stream); a++ {
				for _, b := range []int{a, min(a+1, len(stream)), min(a+7, len(stream)), len(stream)} {
					var s backendScanner
					for _, piece := range [][]byte{stream[:a], stream[a:b], stream[b:]} {
						if _, _, err := s.scan(piece); err != nil {
							t.Fatalf("cuts %d,%d: %v", a, b, err)
						}
					}
					if s.ending != tc.ending {
						t.Fatalf("cuts %d,%d: ending %v, want %v", a, b, s.ending, tc.ending)
					}
				}
			}
		})
	}
}

func TestParseStartup(t *testing.T) {
	startup := encode(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "u", "database": "d"}})
	minor := bytes.Clone(startup)
	binary.BigEndian.PutUint32(minor[4:], 3<<16|1)
	cases := []struct {
		name string
		p    []byte
		ok   bool
	}{
		{"startup", startup, true},
		{"protocol 3.1", minor, true},
		{"ssl", encode(t, &pgproto3.SSLRequest{}), true},
		{"gss", encode(t, &pgproto3.GSSEncRequest{}), true},
		{"cancel", encode(t, &pgproto3.CancelRequest{ProcessID: 7, SecretKey: []byte{1, 2, 3, 4}}), true},
		{"short", []byte{0, 0, 0, 4}, false},
		{"length mismatch", append(bytes.Clone(startup), 0), false},
		{"protocol 2", []byte{0, 0, 0, 8, 0, 2, 0, 0}, false},
		{"ssl with extra", []byte{0, 0, 0, 12, 4, 210, 22, 47, 0, 0, 0, 0}, false},
		{"no terminator", []byte{0, 0, 0, 12, 0, 3, 0, 0, 'u', 's', 'e', 'r'}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseStartup(tc.p)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			if sm, ok := m.(*pgproto3.StartupMessage); ok && err == nil && sm.Parameters["user"] != "u" {
				t.Fatalf("parameters %v", sm.Parameters)
			}
			pkt, err := readStartupPacket(bytes.NewReader(tc.p))
			if err == nil && !bytes.Equal(pkt, tc.p[:len(pkt)]) {
				t.Fatalf("read %q", pkt)
			}
		})
	}
}

func FuzzParseStartup(f *testing.F) {
	f.Add(encode(f, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "u", "database": "d", "application_name": "run:42"}}))
	f.Add(encode(f, &pgproto3.SSLRequest{}))
	f.Add(encode(f, &pgproto3.GSSEncRequest{}))
	f.Add(encode(f, &pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, p []byte) {
		pkt, err := readStartupPacket(bytes.NewReader(p))
		if err != nil {
			return
		}
		if len(pkt) < minStartupPacket || len(pkt) > maxStartupPacket {
			t.Fatalf("packet of %d bytes accepted", len(pkt))
		}
		m, err := parseStartup(pkt)
		if err != nil {
			return
		}
		sm, ok := m.(*pgproto3.StartupMessage)
		if !ok {
			return
		}
		// What the bridge understood survives a round trip through pgproto3.
		again, err := parseStartup(encode(t, sm))
		if err != nil {
			t.Fatalf("re-encoded startup rejected: %v", err)
		}
		sm2 := again.(*pgproto3.StartupMessage)
		if sm2.ProtocolVersion != sm.ProtocolVersion || !maps.Equal(sm.Parameters, sm2.Parameters) {
			t.Fatalf("round trip: %+v != %+v", sm, sm2)
		}
		if loginKey(sm) != loginKey(sm2) {
			t.Fatal("login key depends on parameter order")
		}
	})
}

// FuzzScanners checks that the frame scanners never panic and see the same
// thing however the stream is cut into reads.
func FuzzScanners(f *testing.F) {
	f.Add(encode(f, &pgproto3.Query{String: "select 1"}, &pgproto3.Terminate{}), uint16(3), uint16(9))
	f.Add(encode(f, &pgproto3.Parse{}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.CopyData{Data: []byte("x")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}), uint16(1), uint16(30))
	f.Add(encode(f, &pgproto3.DataRow{Values: [][]byte{[]byte("abc")}}, &pgproto3.ReadyForQuery{TxStatus: 'I'}), uint16(5), uint16(12))
	f.Fuzz(func(t *testing.T, p []byte, a, b uint16) {
		i, j := int(a)%(len(p)+1), int(b)%(len(p)+1)
		if i > j {
			i, j = j, i
		}
		rfqWhole, termWhole, errWhole := frontendSplit(p)
		rfqCut, termCut, errCut := frontendSplit(p, i, j)
		if (errWhole == nil) != (errCut == nil) {
			t.Fatalf("frontend: whole err %v, cut err %v", errWhole, errCut)
		}
		if errWhole == nil && (rfqWhole != rfqCut || (termCut != terminateSplit && termWhole != termCut)) {
			t.Fatalf("frontend: whole %d/%d, cut %d/%d", rfqWhole, termWhole, rfqCut, termCut)
		}

		var whole, cut backendScanner
		rw, sw, ew := whole.scan(p)
		var rc int
		var sc byte
		var ec error
		for _, piece := range [][]byte{p[:i], p[i:j], p[j:]} {
			r, s, e := cut.scan(piece)
			rc += r
			if r > 0 {
				sc = s
			}
			if e != nil {
				ec = e
				break
			}
		}
		if (ew == nil) != (ec == nil) {
			t.Fatalf("backend: whole err %v, cut err %v", ew, ec)
		}
		if ew == nil && (rw != rc || (rw > 0 && sw != sc) || whole.atBoundary() != cut.atBoundary() || whole.ending != cut.ending) {
			t.Fatalf("backend: whole %d %c %v, cut %d %c %v", rw, sw, whole.ending, rc, sc, cut.ending)
		}
	})
}
