package scheduler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxBody bounds a body of the runs API (a submit, a complete): one over
// it is a 400. The ingress that serves the API reads no more than this
// (the app passes it to Ingress.Mount), so the two cannot disagree.
const MaxBody = 4 << 20

// maxIdempotencyKey bounds a submit's idempotency_key.
const maxIdempotencyKey = 1024

// BadRequest is a refusal of the request itself (HTTP 400); its message
// names the problem.
type BadRequest struct{ Msg string }

func (e *BadRequest) Error() string { return e.Msg }

func badRequest(format string, args ...any) error {
	return &BadRequest{Msg: fmt.Sprintf(format, args...)}
}

// submitBody is a parsed POST {path_prefix} body.
type submitBody struct {
	Name           string
	Input          []byte // raw JSON, never nil
	Priority       *int32
	IdempotencyKey string
	NotBefore      time.Time     // zero: none
	Delay          time.Duration // 0: none
}

var submitFields = "name, input, priority, idempotency_key, not_before, delay"

// parseSubmit reads {"name":..., "input":..., "priority":..., "idempotency_key":...}
// strictly: unknown fields, wrong types and trailing data are refused with
// a message naming the field.
func parseSubmit(body []byte) (submitBody, error) {
	var raw struct {
		Name           *string         `json:"name"`
		Input          json.RawMessage `json:"input"`
		Priority       *int32          `json:"priority"`
		IdempotencyKey *string         `json:"idempotency_key"`
		NotBefore      *string         `json:"not_before"`
		Delay          *string         `json:"delay"`
	}
	if err := decodeStrict(body, &raw, submitFields, `{"name":"tenant_sync","input":{...}}`); err != nil {
		return submitBody{}, err
	}
	var notBefore time.Time
	var delay time.Duration
	switch {
	case raw.NotBefore != nil && raw.Delay != nil:
		return submitBody{}, badRequest(`give "not_before" or "delay", not both`)
	case raw.NotBefore != nil:
		t, err := time.Parse(time.RFC3339Nano, *raw.NotBefore)
		if err != nil {
			return submitBody{}, badRequest(`"not_before" %q: want an RFC 3339 time such as "2026-12-04T18:00:00Z"`, *raw.NotBefore)
		}
		notBefore = t
	case raw.Delay != nil:
		d, err := time.ParseDuration(*raw.Delay)
		if err != nil || d < 0 {
			return submitBody{}, badRequest(`"delay" %q: want a duration such as "90s" or "2h", not negative`, *raw.Delay)
		}
		delay = d
	}
	if raw.Name == nil || *raw.Name == "" {
		return submitBody{}, badRequest(`missing "name": the definition to run (a key of scheduler.definitions)`)
	}
	out := submitBody{Name: *raw.Name, Priority: raw.Priority, Input: []byte("{}"), NotBefore: notBefore, Delay: delay}
	if len(raw.Input) > 0 {
		out.Input = bytes.Clone(raw.Input)
	}
	if raw.IdempotencyKey != nil {
		k := *raw.IdempotencyKey
		switch {
		case k == "":
			return submitBody{}, badRequest(`"idempotency_key" is empty; leave it out or give a value`)
		case len(k) > maxIdempotencyKey:
			return submitBody{}, badRequest(`"idempotency_key" is %d bytes; the limit is %d`, len(k), maxIdempotencyKey)
		}
		out.IdempotencyKey = k
	}
	return out, nil
}

// completeBody is a parsed POST {path_prefix}/{id}/complete body.
type completeBody struct {
	Status string
	Output []byte // raw JSON; nil when absent
	Reason string
}

var completeFields = "status, output, reason"

func parseComplete(body []byte) (completeBody, error) {
	var raw struct {
		Status *string         `json:"status"`
		Output json.RawMessage `json:"output"`
		Reason *string         `json:"reason"`
	}
	if err := decodeStrict(body, &raw, completeFields, `{"status":"COMPLETED","output":{...}}`); err != nil {
		return completeBody{}, err
	}
	if raw.Status == nil {
		return completeBody{}, badRequest(`missing "status": one of COMPLETED, FAILED, FAILED_WITH_TERMINAL_ERROR`)
	}
	switch *raw.Status {
	case "COMPLETED", "FAILED", "FAILED_WITH_TERMINAL_ERROR":
	default:
		return completeBody{}, badRequest(`"status" %q: want COMPLETED, FAILED or FAILED_WITH_TERMINAL_ERROR`, *raw.Status)
	}
	out := completeBody{Status: *raw.Status}
	if len(raw.Output) > 0 {
		out.Output = bytes.Clone(raw.Output)
	}
	if raw.Reason != nil {
		out.Reason = *raw.Reason
	}
	return out, nil
}

// maxCancelReason bounds a cancellation's reason, as the worker's reasons
// are bounded by the body limit.
const maxCancelReason = 4096

// parseCancel reads a cancel body: none at all, or {"reason":"..."}.
func parseCancel(body []byte) (string, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return "", nil
	}
	var raw struct {
		Reason *string `json:"reason"`
	}
	if err := decodeStrict(body, &raw, "reason", `{"reason":"superseded by run 42"}`); err != nil {
		return "", err
	}
	if raw.Reason == nil {
		return "", nil
	}
	if len(*raw.Reason) > maxCancelReason {
		return "", badRequest(`"reason" is %d bytes; the limit is %d`, len(*raw.Reason), maxCancelReason)
	}
	return *raw.Reason, nil
}

// decodeStrict decodes one JSON object into v and turns encoding/json's
// errors into messages a caller can act on.
func decodeStrict(body []byte, v any, fields, example string) error {
	if len(body) > MaxBody {
		return badRequest("body is %d bytes; the limit is %d", len(body), MaxBody)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("empty body: want a JSON object like %s", example)
	}
	if !utf8.Valid(body) {
		return badRequest("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("%s", jsonProblem(err, body, fields))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("malformed JSON: unexpected data after the object")
	}
	return checkKeys(body, fields)
}

// checkKeys refuses what encoding/json lets through in a body it decoded:
// a field name in another case ("Name" for name) and a field given twice
// (it keeps the last). Neither is what the caller meant to send.
func checkKeys(body []byte, fields string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: Decode has said so already
	}
	names := strings.Split(fields, ", ")
	var seen [4]string
	n := 0
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		k, _ := t.(string)
		if !slices.Contains(names, k) {
			return badRequest("unknown field %q (fields: %s; names are case-sensitive)", k, fields)
		}
		if slices.Contains(seen[:n], k) {
			return badRequest("field %q appears twice", k)
		}
		if n < len(seen) {
			seen[n] = k
			n++
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

func jsonProblem(err error, body []byte, fields string) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("the body must be a JSON object, not %s", typ.Value)
		}
		return fmt.Sprintf("field %q: want %s, got %s", typ.Field, typeName(typ.Type.String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: the body ends before the object does"
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(msg, "unknown field") {
		return fmt.Sprintf("%s (fields: %s)", msg, fields)
	}
	return "malformed JSON: " + msg
}

func typeName(t string) string {
	switch strings.TrimPrefix(t, "*") {
	case "int32":
		return "an integer between -2147483648 and 2147483647"
	case "string":
		return "a string"
	}
	return t
}
