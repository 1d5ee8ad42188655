package store

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The on-disk form of a run: a version byte, the status at a fixed offset
// (so an update can check it without decoding the rest), then varint
// numbers and length-prefixed strings in a fixed order. Seq is the key, not
// part of the value. Compact because a queue may hold millions of runs.
const codecVersion = 1

// maxField bounds one decoded string or byte field; a corrupt length must
// not allocate gigabytes.
const maxField = 64 << 20

// Encode appends r's stored form to dst.
func Encode(dst []byte, r *Run) []byte {
	dst = append(dst, codecVersion, byte(r.Status))
	dst = binary.AppendVarint(dst, int64(r.Priority))
	dst = binary.AppendVarint(dst, int64(r.Attempt))
	for _, t := range [...]int64{r.CreatedAt, r.QueuedAt, r.StartedAt, r.FinishedAt, r.RetryAt, r.WindowStart} {
		dst = binary.AppendVarint(dst, t)
	}
	for _, s := range [...]string{r.Name, r.Key, r.Tenant, r.IdempotencyKey, r.Reason, r.Control, r.PoolID} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	dst = appendBytes(dst, r.Input)
	dst = appendBytes(dst, r.Output)
	return dst
}

// appendBytes writes nil as length 0 and a non-nil slice as length+1, so
// that a run without output stays distinguishable from an empty output.
func appendBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendUvarint(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b))+1)
	return append(dst, b...)
}

// StatusOf reads the status of an encoded run.
func StatusOf(b []byte) (Status, error) {
	if len(b) < 2 || b[0] != codecVersion {
		return 0, errCorrupt
	}
	return Status(b[1]), nil
}

var errCorrupt = errors.New("corrupt run record")

// Decode reads a run written by Encode. With payload false it skips Input
// and Output (recovery scans millions of runs and needs neither). Strings
// and slices are copies: b may be a page of a memory-mapped file.
func Decode(b []byte, r *Run, payload bool) error {
	d := decoder{b: b}
	if len(b) < 2 || b[0] != codecVersion {
		return fmt.Errorf("decode run: %w (version %d)", errCorrupt, firstByte(b))
	}
	r.Status = Status(b[1])
	if r.Status == 0 || r.Status > maxStatus {
		return fmt.Errorf("decode run: %w (status %d)", errCorrupt, b[1])
	}
	d.b = b[2:]
	r.Priority = int32(d.varint())
	r.Attempt = int32(d.varint())
	for _, t := range [...]*int64{&r.CreatedAt, &r.QueuedAt, &r.StartedAt, &r.FinishedAt, &r.RetryAt, &r.WindowStart} {
		*t = d.varint()
	}
	for _, s := range [...]*string{&r.Name, &r.Key, &r.Tenant, &r.IdempotencyKey, &r.Reason, &r.Control, &r.PoolID} {
		*s = string(d.field(d.uvarint()))
	}
	for _, p := range [...]*[]byte{&r.Input, &r.Output} {
		n := d.uvarint()
		if n == 0 {
			*p = nil
			continue
		}
		f := d.field(n - 1)
		if payload && d.err == nil {
			*p = append(make([]byte, 0, len(f)), f...)
		} else {
			*p = nil
		}
	}
	if d.err != nil {
		return fmt.Errorf("decode run: %w", d.err)
	}
	return nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) field(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > maxField || n > uint64(len(d.b)) {
		d.err = errCorrupt
		return nil
	}
	f := d.b[:n]
	d.b = d.b[n:]
	return f
}
