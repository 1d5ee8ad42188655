package bridge

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// The hot path never parses or copies query payloads: each direction runs a
// frame scanner over the bytes as they pass, keeping only the current
// message's type and how much of it is still to come, across reads. Only two
// things are looked at: which client messages the server will answer with
// ReadyForQuery, and the one status byte of each ReadyForQuery. (And the
// severity at the start of the rare ErrorResponse: a FATAL one means the
// server is ending the session.)

// Message types of protocol 3 a client may send after the startup packet,
// and those a server may send. Anything else is garbage.
var (
	frontendTypes = typeSet("BCDEFHPQSXcdfp")
	backendTypes  = typeSet("123ACDEGHIKNRSTVWZcdnstv")
)

func typeSet(s string) (t [256]bool) {
	for i := 0; i < len(s); i++ {
		t[s[i]] = true
	}
	return t
}

// frames tracks message boundaries: a partly read 5-byte header, or how
// many body bytes of the current message are still to come.
type frames struct {
	hdr  [5]byte
	nhdr int
	typ  byte
	left int // body bytes of the current message still to come
}

// atBoundary reports whether the stream so far ends exactly between
// messages, so that a message of our own can be inserted.
func (f *frames) atBoundary() bool { return f.left == 0 && f.nhdr == 0 }

// header consumes header bytes of p from i. It returns the index after them
// and whether a whole header is now known (f.typ and f.left set).
func (f *frames) header(p []byte, i int, valid *[256]bool) (int, bool, error) {
	var typ byte
	var n int32
	if f.nhdr == 0 && len(p)-i >= 5 {
		typ, n = p[i], int32(binary.BigEndian.Uint32(p[i+1:]))
		i += 5
	} else {
		k := copy(f.hdr[f.nhdr:], p[i:])
		f.nhdr += k
		i += k
		if f.nhdr < 5 {
			return i, false, nil
		}
		f.nhdr = 0
		typ, n = f.hdr[0], int32(binary.BigEndian.Uint32(f.hdr[1:]))
	}
	if !valid[typ] {
		return i, false, fmt.Errorf("invalid message type 0x%02x", typ)
	}
	if n < 4 {
		return i, false, fmt.Errorf("invalid length %d of message %q", n, typ)
	}
	f.typ, f.left = typ, int(n)-4
	return i, true, nil
}

// frontendScanner follows the client→server stream.
type frontendScanner struct {
	frames
	// syncs counts Syncs since the last Execute or Query. A Sync that
	// reaches the server while it is in COPY IN is ignored (libpq sends one
	// after Execute and another after CopyDone), so when copy data follows,
	// those Syncs will get no ReadyForQuery.
	syncs int
	// open is set while an extended-protocol request (Parse, Bind,
	// Describe, Execute, Close, Flush, copy data after an ignored Sync) has
	// no Sync yet. PostgreSQL counts a session idle only once it has sent
	// ReadyForQuery, so a statement sent with Flush and no Sync is running,
	// not idle: the open request counts as one awaited ReadyForQuery, the
	// one its Sync will get.
	open bool
}

// noTerminate is scan's terminate result when the chunk has no Terminate.
const noTerminate = -1

// terminateSplit is scan's terminate result when a Terminate began in an
// earlier chunk: seen, but too late to hold back.
const terminateSplit = -2

// scan follows chunk p. It returns how many more ReadyForQuery messages the
// client now awaits, an open request counting as one (negative when copy
// data shows earlier Syncs will be ignored), and where a Terminate message
// starts in p (noTerminate if none).
func (s *frontendScanner) scan(p []byte) (rfq, terminate int, err error) {
	terminate = noTerminate
	for i := 0; i < len(p); {
		if s.left > 0 {
			n := min(s.left, len(p)-i)
			i += n
			s.left -= n
			continue
		}
		start, split := i, s.nhdr > 0
		var whole bool
		i, whole, err = s.header(p, i, &frontendTypes)
		if err != nil {
			return rfq, terminate, err
		}
		if !whole {
			continue
		}
		switch s.typ {
		case 'Q':
			rfq++
			s.syncs = 0
		case 'E':
			s.syncs = 0
			rfq += s.openRequest()
		case 'P', 'B', 'D', 'C', 'H':
			rfq += s.openRequest()
		case 'S':
			// The Sync's ReadyForQuery is the one an open request awaited.
			if s.open {
				s.open = false
			} else {
				rfq++
			}
			s.syncs++
		case 'F':
			rfq++
		case 'd', 'c', 'f':
			if s.syncs > 0 {
				// The Syncs since Execute will be ignored: the COPY is a
				// request still open until the Sync after it.
				rfq -= s.syncs
				s.syncs = 0
				rfq += s.openRequest()
			}
		case 'X':
			if split {
				terminate = terminateSplit
			} else {
				terminate = start
			}
		}
	}
	return rfq, terminate, nil
}

// openRequest notes an extended-protocol message: it returns 1 if it opens
// a request (one more ReadyForQuery awaited, that of its Sync), else 0.
func (s *frontendScanner) openRequest() int {
	if s.open {
		return 0
	}
	s.open = true
	return 1
}

// backendScanner follows the server→client stream.
type backendScanner struct {
	frames
	wantStatus bool // in a ReadyForQuery whose status byte is still to come
	// The start of the current ErrorResponse, kept to read its severity.
	errHead  [errHeadLen]byte
	nErrHead int
	errLeft  int  // bytes still to be kept in errHead
	ending   bool // a FATAL or PANIC ErrorResponse passed: the server closes the session
}

// errHeadLen is how much of an ErrorResponse is kept: enough for the two
// fields the server sends first, S (severity, possibly translated) and V
// (severity, never translated; PostgreSQL 9.6 and later).
const errHeadLen = 64

// endsSession reports whether the start of an ErrorResponse body gives a
// severity after which the server closes the connection.
func endsSession(head []byte) bool {
	var sev []byte
	for len(head) > 0 && head[0] != 0 {
		n := bytes.IndexByte(head[1:], 0)
		if n < 0 {
			break // cut off by errHeadLen
		}
		v := head[1 : 1+n]
		switch head[0] {
		case 'V':
			return fatalSeverity(v)
		case 'S':
			sev = v // the answer unless a V follows
		}
		head = head[2+n:]
	}
	return fatalSeverity(sev)
}

func fatalSeverity(v []byte) bool { return string(v) == "FATAL" || string(v) == "PANIC" }

// scan follows chunk p. It returns how many ReadyForQuery messages ended in
// p and the status of the last one ('I' idle, 'T' in a transaction, 'E' in
// a failed transaction).
func (s *backendScanner) scan(p []byte) (rfq int, status byte, err error) {
	for i := 0; i < len(p); {
		if s.left > 0 {
			if s.wantStatus {
				s.wantStatus = false
				status = p[i]
				if status != 'I' && status != 'T' && status != 'E' {
					return rfq, status, fmt.Errorf("invalid ReadyForQuery status 0x%02x", status)
				}
				rfq++
			}
			n := min(s.left, len(p)-i)
			if s.errLeft > 0 {
				k := copy(s.errHead[s.nErrHead:s.nErrHead+s.errLeft], p[i:i+n])
				s.nErrHead += k
				s.errLeft -= k
				if s.errLeft == 0 && endsSession(s.errHead[:s.nErrHead]) {
					s.ending = true
				}
			}
			i += n
			s.left -= n
			continue
		}
		var whole bool
		i, whole, err = s.header(p, i, &backendTypes)
		if err != nil {
			return rfq, status, err
		}
		switch {
		case !whole:
		case s.typ == 'Z':
			if s.left != 1 {
				return rfq, status, fmt.Errorf("invalid ReadyForQuery length %d", s.left+4)
			}
			s.wantStatus = true
		case s.typ == 'E':
			s.nErrHead, s.errLeft = 0, min(s.left, errHeadLen)
		}
	}
	return rfq, status, nil
}
