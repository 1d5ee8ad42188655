package grpcegress

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func TestReplayBody(t *testing.T) {
	small := bytes.Repeat([]byte("abcdefgh"), 100)
	long := bytes.Repeat([]byte("0123456789"), replayMax/10+100)
	tests := []struct {
		name       string
		body       []byte
		readBefore int  // read by the first attempt before GetBody
		resend     bool // GetBody gives the body again
	}{
		{"nothing read yet", small, 0, true},
		{"part read", small, 100, true},
		{"all read", small, len(small), true},
		{"long, resent early", long, 1000, true},
		{"long, past the limit", long, replayMax + 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// HalfReader: the caller's body arrives in pieces.
			first, getBody := newReplayBody(io.NopCloser(iotest.HalfReader(bytes.NewReader(tt.body))), replayMax)
			got, err := io.ReadAll(io.LimitReader(first, int64(tt.readBefore)))
			if err != nil || !bytes.Equal(got, tt.body[:tt.readBefore]) {
				t.Fatalf("first attempt read %d bytes, %v", len(got), err)
			}
			first.Close() // the transport closes a body it abandons
			second, err := getBody()
			if !tt.resend {
				if !errors.Is(err, errReplayTooLong) {
					t.Fatalf("GetBody past the limit: %v", err)
				}
				// The first attempt reads on to the end, nothing lost.
				rest, err := io.ReadAll(first)
				if err != nil || !bytes.Equal(append(got, rest...), tt.body) {
					t.Fatalf("first attempt after a refused GetBody: %d bytes, %v", len(got)+len(rest), err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n, err := first.Read(make([]byte, 10)); n != 0 || !errors.Is(err, errReplaced) {
				t.Fatalf("abandoned attempt read %d, %v", n, err)
			}
			all, err := io.ReadAll(second)
			if err != nil || !bytes.Equal(all, tt.body) {
				t.Fatalf("resent body: %d bytes of %d, %v", len(all), len(tt.body), err)
			}
		})
	}
}

// A read error of the caller's body reaches every attempt.
func TestReplayBodyError(t *testing.T) {
	boom := errors.New("client reset")
	first, getBody := newReplayBody(io.NopCloser(io.MultiReader(bytes.NewReader([]byte("head")), iotest.ErrReader(boom))), replayMax)
	if got, err := io.ReadAll(first); !errors.Is(err, boom) || string(got) != "head" {
		t.Fatalf("%q %v", got, err)
	}
	second, _ := getBody()
	if got, err := io.ReadAll(second); !errors.Is(err, boom) || string(got) != "head" {
		t.Fatalf("resent: %q %v", got, err)
	}
}
