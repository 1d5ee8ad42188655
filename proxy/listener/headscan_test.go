package listener

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzHeadScan: the first head's scan gives the same verdict however the
// bytes are split across reads, refuses exactly the heads with a LF not
// after a CR before their CRLFCRLF, and stops looking at that CRLFCRLF.
func FuzzHeadScan(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 3)
	f.Add([]byte("GET / HTTP/1.1\nHost: a\n\n"), 15)
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n\n\n\n"), 0)
	f.Add([]byte("\r\r\n\r\n"), 1)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		if cut < 0 || cut > len(b) {
			cut = len(b) / 2
		}
		var whole, split headScan
		errWhole := whole.scan(b)
		errSplit := split.scan(b[:cut])
		if errSplit == nil && !split.done {
			errSplit = split.scan(b[cut:])
		}
		if (errWhole == nil) != (errSplit == nil) || whole.done != split.done {
			t.Fatalf("%q: whole %v/%v, split at %d %v/%v", b, errWhole, whole.done, cut, errSplit, split.done)
		}
		// What a head is: the bytes up to its first CRLFCRLF.
		head := b
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			head = b[:i+4]
		}
		bare := false
		for i, c := range head {
			if c == '\n' && (i == 0 || head[i-1] != '\r') {
				bare = true
				head = head[:i]
				break
			}
		}
		if bare != errors.Is(errWhole, ErrBareLF) {
			t.Fatalf("%q: bare LF in the head %v, refused %v", b, bare, errWhole)
		}
		if !bare && whole.done != bytes.Contains(head, []byte("\r\n\r\n")) {
			t.Fatalf("%q: done %v", b, whole.done)
		}
	})
}
