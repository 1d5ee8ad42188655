package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Startup-phase request codes (the first int32 after the length).
const (
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
	cancelRequestCode = 80877102
)

// Startup packet bounds: length and code at least; PostgreSQL's own
// MAX_STARTUP_PACKET_LENGTH at most.
const (
	minStartupPacket = 8
	maxStartupPacket = 10000
)

// readStartupPacket reads one length-prefixed startup-phase packet and
// returns it whole, length included. The length is checked before the rest
// is read, so a client announcing garbage is answered at once.
func readStartupPacket(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.BigEndian.Uint32(hdr[:])))
	if n < minStartupPacket || n > maxStartupPacket {
		return nil, fmt.Errorf("invalid startup packet length %d", n)
	}
	pkt := make([]byte, n)
	copy(pkt, hdr[:])
	if _, err := io.ReadFull(r, pkt[4:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read startup packet: %w", err)
	}
	return pkt, nil
}

// parseStartup decodes a whole startup-phase packet with pgproto3: an
// SSLRequest, a GSSENCRequest, a CancelRequest or a StartupMessage.
func parseStartup(pkt []byte) (pgproto3.FrontendMessage, error) {
	if len(pkt) < minStartupPacket || int(binary.BigEndian.Uint32(pkt)) != len(pkt) {
		return nil, fmt.Errorf("invalid startup packet length %d", len(pkt))
	}
	body := pkt[4:]
	code := binary.BigEndian.Uint32(body)
	switch code {
	case sslRequestCode:
		if len(body) != 4 {
			return nil, errors.New("malformed SSLRequest")
		}
		m := &pgproto3.SSLRequest{}
		return m, m.Decode(body)
	case gssEncRequestCode:
		if len(body) != 4 {
			return nil, errors.New("malformed GSSENCRequest")
		}
		m := &pgproto3.GSSEncRequest{}
		return m, m.Decode(body)
	case cancelRequestCode:
		m := &pgproto3.CancelRequest{}
		if err := m.Decode(body); err != nil {
			return nil, fmt.Errorf("malformed CancelRequest: %w", err)
		}
		return m, nil
	}
	if code>>16 != 3 {
		return nil, fmt.Errorf("unsupported frontend protocol %d.%d: the bridge speaks protocol 3", code>>16, code&0xffff)
	}
	// pgproto3 decodes 3.0 and 3.2; any other 3.x minor has the same
	// layout, and the server answers it with NegotiateProtocolVersion.
	dec := body
	if code != pgproto3.ProtocolVersion30 && code != pgproto3.ProtocolVersion32 {
		dec = append([]byte(nil), body...)
		binary.BigEndian.PutUint32(dec, pgproto3.ProtocolVersion30)
	}
	m := &pgproto3.StartupMessage{}
	if err := m.Decode(dec); err != nil {
		return nil, fmt.Errorf("malformed StartupMessage: %w", err)
	}
	m.ProtocolVersion = code
	return m, nil
}

// maxNegotiations bounds SSLRequest/GSSENCRequest rounds before the startup
// message (libpq sends at most one of each).
const maxNegotiations = 2

// negotiate reads startup-phase packets from c, declining TLS and GSS
// encryption with 'N' (the bridge does not terminate either; a client that
// requires them fails here, as against a server without them), until a
// StartupMessage or CancelRequest. It returns that packet raw and decoded.
func negotiate(c io.ReadWriter) ([]byte, pgproto3.FrontendMessage, error) {
	for round := 0; ; round++ {
		pkt, err := readStartupPacket(c)
		if err != nil {
			return nil, nil, err
		}
		msg, err := parseStartup(pkt)
		if err != nil {
			return nil, nil, err
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if round >= maxNegotiations {
				return nil, nil, errors.New("too many encryption requests")
			}
			if _, err := c.Write([]byte{'N'}); err != nil {
				return nil, nil, err
			}
			continue
		}
		return pkt, msg, nil
	}
}
