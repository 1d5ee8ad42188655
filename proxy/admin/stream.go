package admin

import (
	"encoding/json"
	"net/http"
)

// writeList writes rows as an indented JSON array, one element at a
// time, straight to w: an answer costs the memory of its largest element,
// not of the whole array (json.Encoder would build all of it first). The
// bytes are those json.Encoder with a two-space indent writes. A nil or
// empty rows is [].
func writeList[T any](w http.ResponseWriter, code int, rows []T) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if len(rows) == 0 {
		_, _ = w.Write([]byte("[]\n"))
		return
	}
	sep := []byte("[\n  ")
	for _, row := range rows {
		b, err := json.MarshalIndent(row, "  ", "  ")
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
