package admin

import (
	"encoding/json"
	"net/http"
	"reflect"
)

// writeList writes the slice v as an indented JSON array, one element at a
// time, straight to w: an answer costs the memory of its largest element,
// not of the whole array (json.Encoder would build all of it first). The
// bytes are those json.Encoder with a two-space indent writes. A nil or
// empty v is [].
func writeList(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.Kind() != reflect.Slice || rv.Len() == 0 {
		_, _ = w.Write([]byte("[]\n"))
		return
	}
	sep := []byte("[\n  ")
	for i := range rv.Len() {
		b, err := json.MarshalIndent(rv.Index(i).Interface(), "  ", "  ")
		if err != nil {
			return // a value the encoder refuses: the array stays unfinished, as a cut stream would
		}
		// net/http buffers the writes: no syscall per element.
		if _, err := w.Write(sep); err != nil {
			return // the client went away
		}
		if _, err := w.Write(b); err != nil {
			return
		}
		sep = []byte(",\n  ")
	}
	_, _ = w.Write([]byte("\n]\n"))
}
