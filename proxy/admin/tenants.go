package admin

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/warden-dev/warden/governor/tenant"
)

// tenants serves GET /v1/tenants (SPEC §12): a JSON array of rows, as it
// was before pagination, so clients that read the array still work.
//
//	?limit=N      at most N rows (default 100, at most 1000), busiest first
//	?after=C      the page after cursor C
//	?tenant=NAME  NAME's window on each listener; limit and after do not apply
//
// When more rows follow, the Link header gives the next page:
//
//	Link: </v1/tenants?after=C&limit=N>; rel="next"
func (s *server) tenants(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("tenant") {
		var rows []tenant.Usage
		if s.cfg.Sources.Tenant != nil {
			rows = s.cfg.Sources.Tenant(q.Get("tenant"))
		}
		writeList(w, http.StatusOK, rows)
		return
	}
	limit := tenant.DefaultListLimit
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > tenant.MaxListLimit {
			writeError(w, http.StatusBadRequest, "limit must be an integer from 1 to "+strconv.Itoa(tenant.MaxListLimit))
			return
		}
		limit = n
	}
	var after *tenant.Cursor
	if q.Has("after") {
		c, err := tenant.ParseCursor(q.Get("after"))
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		after = &c
	}
	var rows []tenant.Usage
	var next *tenant.Cursor
	if s.cfg.Sources.Tenants != nil {
		rows, next = s.cfg.Sources.Tenants(limit, after)
	}
	if next != nil {
		link := url.Values{"limit": {strconv.Itoa(limit)}, "after": {next.String()}}
		w.Header().Set("Link", "</v1/tenants?"+link.Encode()+`>; rel="next"`)
	}
	writeList(w, http.StatusOK, rows)
}
