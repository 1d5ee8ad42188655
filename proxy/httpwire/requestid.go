package httpwire

import (
	"crypto/rand"
	"encoding/binary"
	"sync/atomic"
)

// RequestIDs makes x-request-id values: 32 hex digits, unique within the
// process and, with a random per-process key, across processes. It is a
// counter run through a keyed bijective mixer rather than a random draw
// per request, which would cost a system call or a locked source per
// request on the hot path.
type RequestIDs struct {
	key  [2]uint64
	next atomic.Uint64
}

// NewRequestIDs seeds a generator from the system's random source.
func NewRequestIDs() *RequestIDs {
	var b [24]byte
	_, _ = rand.Read(b[:]) // never fails on supported platforms (Go 1.24+)
	g := &RequestIDs{key: [2]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:16])}}
	g.next.Store(binary.LittleEndian.Uint64(b[16:]))
	return g
}

// Append appends a fresh ID to dst.
func (g *RequestIDs) Append(dst []byte) []byte {
	n := g.next.Add(1)
	hi := mix(n ^ g.key[0])
	lo := mix(hi ^ n ^ g.key[1])
	dst = appendHex64(dst, hi)
	return appendHex64(dst, lo)
}

// mix is splitmix64's finaliser: a bijection on uint64, so distinct
// counters give distinct outputs.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

const hexDigits = "0123456789abcdef"

func appendHex64(dst []byte, v uint64) []byte {
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hexDigits[(v>>uint(shift))&0xf])
	}
	return dst
}
