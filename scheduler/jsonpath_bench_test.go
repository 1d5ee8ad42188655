package scheduler

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// lookupRaw is the simple alternative to lookupJSON: decode each level
// into a map of json.RawMessage and render the value found. It is the
// baseline lookupJSON must beat to be worth its own scanner (issue 31);
// it answers the same on valid documents (TestLookupRawAgrees).
func lookupRaw(doc []byte, path []string) (string, bool) {
	v := json.RawMessage(doc)
	for _, name := range path {
		var obj map[string]json.RawMessage
		if json.Unmarshal(v, &obj) != nil {
			return "", false
		}
		var ok bool
		if v, ok = obj[name]; !ok {
			return "", false
		}
	}
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0, v[0] == 'n':
		return "", false
	case v[0] == '"':
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	case v[0] == '{', v[0] == '[':
		var b bytes.Buffer
		if json.Compact(&b, v) != nil {
			return "", false
		}
		return b.String(), true
	}
	return string(v), true
}

// keyInputs are run inputs as a definition key reads them: the small body
// of make bench-scheduler, a nested account id, and a 2.4 KB order whose key
// field comes after its line items.
var keyInputs = func() []struct {
	name string
	doc  []byte
	path []string
} {
	var items strings.Builder
	for i := range 40 {
		if i > 0 {
			items.WriteByte(',')
		}
		items.WriteString(`{"sku":"SKU-` + strconv.Itoa(1000+i) + `","qty":` + strconv.Itoa(i%7+1) + `,"price":19.95,"tags":["a","b"]}`)
	}
	return []struct {
		name string
		doc  []byte
		path []string
	}{
		{"small", []byte(`{"tenantId":"acme","orderId":1234567}`), []string{"tenantId"}},
		{"nested", []byte(`{"account":{"id":"a-42","plan":"pro","region":"eu"},"action":"sync","since":"2026-12-01T00:00:00Z"}`), []string{"account", "id"}},
		{"large", []byte(`{"order":{"items":[` + items.String() + `],"customer":{"tenantId":"acme-eu","email":"ops@example.com"}}}`), []string{"order", "customer", "tenantId"}},
	}
}()

func TestLookupRawAgrees(t *testing.T) {
	for _, in := range keyInputs {
		got, ok := lookupJSON(in.doc, in.path)
		want, wantOK := lookupRaw(in.doc, in.path)
		if got != want || ok != wantOK || !ok {
			t.Errorf("%s: lookupJSON %q %v, lookupRaw %q %v", in.name, got, ok, want, wantOK)
		}
	}
}

// BenchmarkLookupJSON compares the scanner with the json.RawMessage walk:
//
//	go test -run '^$' -bench LookupJSON -benchmem ./scheduler
func BenchmarkLookupJSON(b *testing.B) {
	for _, in := range keyInputs {
		for _, impl := range []struct {
			name   string
			lookup func([]byte, []string) (string, bool)
		}{{"scanner", lookupJSON}, {"rawmessage", lookupRaw}} {
			b.Run(in.name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(in.doc)))
				b.ReportAllocs()
				for b.Loop() {
					if _, ok := impl.lookup(in.doc, in.path); !ok {
						b.Fatal("not found")
					}
				}
			})
		}
	}
}
