package scheduler

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParseSubmit(t *testing.T) {
	b, err := parseSubmit([]byte(` {"name":"sync","input":{"a":[1,2]},"priority":-3,"idempotency_key":"k"} `))
	if err != nil || b.Name != "sync" || string(b.Input) != `{"a":[1,2]}` || *b.Priority != -3 || b.IdempotencyKey != "k" {
		t.Fatalf("%+v %v", b, err)
	}
	b, err = parseSubmit([]byte(`{"name":"sync"}`))
	if err != nil || string(b.Input) != "{}" || b.Priority != nil {
		t.Fatalf("defaults: %+v %v", b, err)
	}
	if _, err := parseSubmit(make([]byte, MaxBody+1)); err == nil {
		t.Fatal("oversized body accepted")
	}
}

// FuzzParseSubmit: every body is either a *BadRequest or a submission with
// a name and an input that is valid JSON; never a panic or another error.
// The same bodies go to the cancel parser: a *BadRequest or a bounded
// reason.
func FuzzParseSubmit(f *testing.F) {
	for _, s := range []string{`{"name":"a","input":{"x":1},"priority":2,"idempotency_key":"k"}`, `{"name":""}`,
		`{"name":"a","input":null}`, `[]`, `{"name":"a"} x`, `{"name":"a","priority":99999999999}`, "{\"name\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if reason, err := parseCancel(body); err != nil {
			var bad *BadRequest
			if !errors.As(err, &bad) || bad.Msg == "" {
				t.Fatalf("cancel: error %v is not a BadRequest with a message", err)
			}
		} else if len(reason) > maxCancelReason {
			t.Fatalf("cancel: a reason of %d bytes accepted", len(reason))
		}
		b, err := parseSubmit(body)
		if err != nil {
			var bad *BadRequest
			if !errors.As(err, &bad) || bad.Msg == "" {
				t.Fatalf("error %v is not a BadRequest with a message", err)
			}
			return
		}
		if b.Name == "" || !json.Valid(b.Input) {
			t.Fatalf("accepted %q as name %q input %q", body, b.Name, b.Input)
		}
		c, err := parseComplete(body)
		if err == nil && c.Status == "" {
			t.Fatal("complete without a status accepted")
		}
	})
}

func TestParseCancel(t *testing.T) {
	tests := []struct {
		body, reason, err string
	}{
		{"", "", ""},
		{"  \n", "", ""},
		{`{}`, "", ""},
		{`{"reason":"superseded"}`, "superseded", ""},
		{`{"reason":null}`, "", ""},
		{`{"Reason":"x"}`, "", `unknown field "Reason"`},
		{`{"reason":1}`, "", `"reason"`},
		{`{"reason":"a","reason":"b"}`, "", `"reason"`},
		{`{"reason":"` + strings.Repeat("x", maxCancelReason+1) + `"}`, "", "the limit is 4096"},
		{`[]`, "", ""},
	}
	for _, tt := range tests {
		reason, err := parseCancel([]byte(tt.body))
		switch {
		case tt.body == `[]`:
			if err == nil {
				t.Errorf("%.40q: accepted", tt.body)
			}
		case tt.err == "" && (err != nil || reason != tt.reason):
			t.Errorf("%.40q: reason %q err %v, want %q", tt.body, reason, err, tt.reason)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%.40q: err %v, want one naming %s", tt.body, err, tt.err)
		}
	}
}

// Field names are exact: encoding/json alone would take "Name" or
// "PRIORITY" for name and priority, and the last of two "name"s.
func TestBodyFieldNamesAreExactAndOnce(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string // fragment of the 400's message
	}{
		{"submit Name", `{"Name":"sync"}`, `unknown field "Name"`},
		{"submit PRIORITY", `{"name":"sync","PRIORITY":3}`, `unknown field "PRIORITY"`},
		{"submit Idempotency_Key", `{"name":"sync","Idempotency_Key":"k"}`, `unknown field "Idempotency_Key"`},
		{"submit name twice", `{"name":"plain","name":"hipri"}`, `"name" appears twice`},
		{"complete STATUS", `{"STATUS":"COMPLETED"}`, `unknown field "STATUS"`},
		{"complete status twice", `{"status":"FAILED","status":"COMPLETED"}`, `"status" appears twice`},
		{"nested keys are the input's own", `{"name":"sync","input":{"Name":1,"a":1,"a":2}}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.name[:8] == "complete" {
				_, err = parseComplete([]byte(tc.body))
			} else {
				_, err = parseSubmit([]byte(tc.body))
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var bad *BadRequest
			if !errors.As(err, &bad) || !strings.Contains(bad.Msg, tc.want) {
				t.Fatalf("got %v, want a 400 saying %s", err, tc.want)
			}
		})
	}
}
