package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/control"
)

// Handler serves the runs API under scheduler.path_prefix (read per
// request, so a reload that moves the prefix takes effect at once):
//
//	POST {prefix}                 submit         → 202
//	GET  {prefix}?status=&name=&key=&after=&limit=  list
//	GET  {prefix}/{id}            get
//	POST {prefix}/{id}/complete   complete
//	POST {prefix}/{id}/heartbeat  heartbeat
//	POST {prefix}/{id}/cancel     cancel
//
// The ingress listener mounts it after its per-tenant cap, so a tenant over
// its cap gets the 429 before reaching the scheduler.
func (s *Scheduler) Handler() fasthttp.RequestHandler { return s.serve }

// PathPrefix is the current scheduler.path_prefix; "" while stopped.
func (s *Scheduler) PathPrefix() string {
	if cfg := s.cfgPtr.Load(); cfg != nil {
		return cfg.prefix
	}
	return ""
}

const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

func (s *Scheduler) serve(c *fasthttp.RequestCtx) {
	prefix := s.PathPrefix()
	path := string(c.Path())
	if prefix == "" {
		writeError(c, fasthttp.StatusServiceUnavailable, ErrStopped.Error())
		return
	}
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok || rest != "" && rest[0] != '/' {
		writeError(c, fasthttp.StatusNotFound, "no such endpoint: the runs API is under "+prefix)
		return
	}
	rest = strings.Trim(rest, "/")
	parts := strings.Split(rest, "/")
	ctx := context.Background()
	switch {
	case rest == "":
		switch {
		case c.IsPost():
			s.serveSubmit(ctx, c)
		case c.IsGet():
			s.serveList(ctx, c)
		default:
			methodNotAllowed(c, "GET, POST")
		}
	case len(parts) == 1:
		if !c.IsGet() {
			methodNotAllowed(c, "GET")
			return
		}
		v, err := s.Get(ctx, parts[0])
		s.reply(c, fasthttp.StatusOK, v, err, parts[0])
	case len(parts) == 2 && parts[1] == "cancel":
		if !c.IsPost() {
			methodNotAllowed(c, "POST")
			return
		}
		reason, err := parseCancel(c.PostBody())
		if err != nil {
			s.reply(c, 0, nil, err, parts[0])
			return
		}
		v, err := s.Cancel(ctx, parts[0], reason)
		s.reply(c, fasthttp.StatusOK, v, err, parts[0])
	case len(parts) == 2 && (parts[1] == "complete" || parts[1] == "heartbeat"):
		if !c.IsPost() {
			methodNotAllowed(c, "POST")
			return
		}
		if parts[1] == "heartbeat" {
			v, err := s.Heartbeat(ctx, parts[0])
			s.reply(c, fasthttp.StatusOK, v, err, parts[0])
			return
		}
		body, err := parseComplete(c.PostBody())
		if err != nil {
			s.reply(c, 0, nil, err, parts[0])
			return
		}
		v, err := s.Complete(ctx, parts[0], Completion{Status: body.Status, Output: body.Output, Reason: body.Reason})
		s.reply(c, fasthttp.StatusOK, v, err, parts[0])
	default:
		writeError(c, fasthttp.StatusNotFound, "no such endpoint: "+path)
	}
}

func (s *Scheduler) serveSubmit(ctx context.Context, c *fasthttp.RequestCtx) {
	body, err := parseSubmit(c.PostBody())
	if err != nil {
		s.reply(c, 0, nil, err, "")
		return
	}
	v, _, err := s.Submit(ctx, SubmitRequest{
		Name: body.Name, Input: body.Input, Priority: body.Priority, IdempotencyKey: body.IdempotencyKey,
		NotBefore: body.NotBefore, Delay: body.Delay,
		Header: func(name string) []byte {
			// The request is alive for the whole call; copy what is kept.
			return c.Request.Header.Peek(name)
		},
	})
	if err != nil {
		s.reply(c, 0, nil, err, "")
		return
	}
	if v.Control != nil {
		c.Response.Header.Set(control.Header, *v.Control)
	}
	writeJSON(c, fasthttp.StatusAccepted, v)
}

func (s *Scheduler) serveList(ctx context.Context, c *fasthttp.RequestCtx) {
	args := c.QueryArgs()
	limit := defaultListLimit
	if l := args.Peek("limit"); len(l) > 0 {
		n, err := strconv.Atoi(string(l))
		if err != nil || n < 1 || n > maxListLimit {
			writeError(c, fasthttp.StatusBadRequest, "limit must be an integer from 1 to "+strconv.Itoa(maxListLimit))
			return
		}
		limit = n
	}
	var after uint64
	if a := args.Peek("after"); len(a) > 0 {
		seq, ok := s.parseID(string(a))
		if !ok {
			writeError(c, fasthttp.StatusBadRequest, "after must be a run id")
			return
		}
		after = seq
	}
	runs, err := s.List(ctx, ListFilter{Status: string(args.Peek("status")), Name: string(args.Peek("name")),
		Key: string(args.Peek("key")), After: after, Limit: limit})
	s.reply(c, fasthttp.StatusOK, runs, err, "")
}

// reply writes v, or the error as the status it maps to.
func (s *Scheduler) reply(c *fasthttp.RequestCtx, code int, v any, err error, id string) {
	var bad *BadRequest
	var conflict *Conflict
	switch {
	case err == nil:
		writeJSON(c, code, v)
	case errors.As(err, &bad):
		writeError(c, fasthttp.StatusBadRequest, bad.Msg)
	case errors.As(err, &conflict):
		writeError(c, fasthttp.StatusConflict, conflict.Msg)
	case errors.Is(err, ErrNotFound):
		writeError(c, fasthttp.StatusNotFound, "run "+strconv.Quote(id)+" not found")
	case errors.Is(err, ErrStopped):
		writeError(c, fasthttp.StatusServiceUnavailable, err.Error())
	default:
		s.log.Error("runs API", "path", string(c.Path()), "err", err)
		writeError(c, fasthttp.StatusInternalServerError, err.Error())
	}
}

func methodNotAllowed(c *fasthttp.RequestCtx, allow string) {
	c.Response.Header.Set("Allow", allow)
	writeError(c, fasthttp.StatusMethodNotAllowed, "method "+string(c.Method())+" not allowed; use "+allow)
}

func writeJSON(c *fasthttp.RequestCtx, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = fasthttp.StatusInternalServerError, []byte(`{"error":"encode response"}`)
	}
	c.SetStatusCode(code)
	c.SetContentType("application/json")
	c.SetBody(append(b, '\n'))
}

func writeError(c *fasthttp.RequestCtx, code int, msg string) {
	writeJSON(c, code, struct {
		Error string `json:"error"`
	}{msg})
}
