package connpool

import (
	"bufio"
	"errors"
	"io"
)

// Chunked transfer coding (RFC 9112 §7.1), read strictly: a response whose
// framing is ambiguous must not be passed on, or the next response on the
// same connection could be smuggled into it.

var (
	errChunkSize    = errors.New("malformed chunk size line")
	errChunkData    = errors.New("chunk data not followed by CRLF")
	errChunkTrailer = errors.New("malformed chunked trailer section")
)

// maxChunkHexDigits keeps a chunk size within int64.
const maxChunkHexDigits = 15

// chunkedReader decodes a chunked body from br. The zero value is ready
// after reset.
type chunkedReader struct {
	br    *bufio.Reader
	left  int64 // data bytes left in the current chunk
	inEnd bool  // the current chunk's data is read; its CRLF is not
	done  bool
}

func (r *chunkedReader) reset(br *bufio.Reader) { *r = chunkedReader{br: br} }

func (r *chunkedReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	if r.left == 0 {
		if r.inEnd {
			if err := readCRLF(r.br); err != nil {
				return 0, err
			}
			r.inEnd = false
		}
		size, err := readChunkSize(r.br)
		if err != nil {
			return 0, err
		}
		if size == 0 {
			if err := skipTrailers(r.br); err != nil {
				return 0, err
			}
			r.done = true
			return 0, io.EOF
		}
		r.left = size
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.br.Read(p)
	r.left -= int64(n)
	if r.left == 0 {
		r.inEnd = true
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func readCRLF(br *bufio.Reader) error {
	b, err := br.Peek(2)
	if err != nil {
		return eofIsUnexpected(err)
	}
	if b[0] != '\r' || b[1] != '\n' {
		return errChunkData
	}
	_, _ = br.Discard(2)
	return nil
}

// readChunkSize reads "HEX[ext]\r\n" and returns the size.
func readChunkSize(br *bufio.Reader) (int64, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if err == bufio.ErrBufferFull {
			return 0, errChunkSize
		}
		return 0, eofIsUnexpected(err)
	}
	return parseChunkSize(line)
}

// parseChunkSize parses one size line including its CRLF.
func parseChunkSize(line []byte) (int64, error) {
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, errChunkSize
	}
	line = line[:len(line)-2]
	var size int64
	i := 0
	for ; i < len(line); i++ {
		d, ok := hexVal(line[i])
		if !ok {
			break
		}
		if i == maxChunkHexDigits {
			return 0, errChunkSize
		}
		size = size<<4 | int64(d)
	}
	if i == 0 {
		return 0, errChunkSize
	}
	rest := line[i:]
	j := 0
	for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t') {
		j++
	}
	if j == len(rest) {
		return size, nil // nothing, or trailing whitespace only
	}
	if j > 0 {
		// Whitespace before ';' is allowed by RFC 9112 (BWS) but refused
		// by net/http, Go's reference decoder: a proxy and the server
		// behind it must not read a body differently, so this reader is
		// never more lenient than that one.
		return 0, errChunkSize
	}
	// Extensions are ignored, but they may carry no control bytes.
	if rest[0] != ';' {
		return 0, errChunkSize
	}
	for _, c := range rest {
		if c < ' ' && c != '\t' || c == 0x7f {
			return 0, errChunkSize
		}
	}
	return size, nil
}

// skipTrailers consumes the trailer section after the last chunk. Trailers
// are not forwarded by the HTTP/1.1 proxies.
func skipTrailers(br *bufio.Reader) error {
	for range 64 {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err == bufio.ErrBufferFull {
				return errChunkTrailer
			}
			return eofIsUnexpected(err)
		}
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return errChunkTrailer
		}
		if len(line) == 2 {
			return nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return errChunkTrailer
		}
	}
	return errChunkTrailer
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendChunkHeader appends the size line of a chunk of n bytes.
func appendChunkHeader(dst []byte, n int) []byte {
	const hex = "0123456789abcdef"
	var tmp [16]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = hex[n&0xf]
		n >>= 4
		if n == 0 {
			break
		}
	}
	dst = append(dst, tmp[i:]...)
	return append(dst, '\r', '\n')
}
