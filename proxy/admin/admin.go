// Package admin serves warden's admin API (SPEC §8): health, readiness,
// Prometheus metrics, the state of every control, resets and reloads.
//
// The admin listener is plain net/http: it is off the data path, and
// promhttp and the JSON encoders are written for it.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/proxy/bridge"
	"github.com/warden-dev/warden/scheduler"
)

// PolicyStatus is the body of GET /v1/policy.
type PolicyStatus struct {
	Source          string `json:"source"`
	Hash            string `json:"hash"`
	LoadedAt        string `json:"loaded_at"`
	LastReloadError string `json:"last_reload_error"`
	// ApplyError lists what the running policy's components could not
	// apply (each kept its previous settings); "" once it is wholly in
	// force.
	ApplyError   string   `json:"apply_error"`
	LastReloadAt string   `json:"last_reload_at,omitempty"`
	Warnings     []string `json:"warnings"`
}

// Sources is where the admin API reads state and sends commands. A nil list
// source serves an empty list: that part of warden is off. Each func is
// called per request and must be safe for concurrent use. A list source
// returns a slice bounded by the policy (one row per pool, breaker, bridge,
// semaphore, queue); Tenants, whose rows come from clients, returns a page.
type Sources struct {
	Ready func() error // nil error: ready
	// Degraded lists what serves in a degraded mode (a fail_open backend
	// outage): /readyz stays 200 and names them in "degraded".
	Degraded func() []string
	Policy   func() PolicyStatus
	// Reload reloads the policy. A *PartialApplyError says the policy was
	// put in force but some components kept their previous settings; any
	// other error says nothing changed.
	Reload func() error

	Pools      func() []pool.Snapshot
	ResetPool  func(id string) bool // false: no such pool
	ResetPools func()
	Breakers   func() []breaker.Snapshot
	// Tenants lists a page of at most limit tenant windows after the
	// cursor (nil: from the top), and the next page's cursor (nil: none),
	// as tenant.List; Tenant looks one tenant up, as tenant.Find.
	Tenants    func(limit int, after *tenant.Cursor) ([]tenant.Usage, *tenant.Cursor)
	Tenant     func(name string) []tenant.Usage
	Bridges    func() []bridge.Snapshot
	Semaphores func() []scheduler.SemaphoreState
	Queues     func() []scheduler.QueueState
}

// Config is the admin listener's configuration.
type Config struct {
	TokenEnv string // environment variable holding the bearer token, read by New
	Metrics  *metrics.Metrics
	Sources  Sources
	Log      *slog.Logger
}

// API is the admin API's handler. It outlives listeners: a reload that
// moves admin.listen serves the same API on the new address, and
// SetTokenEnv makes it follow admin.token_env.
type API struct {
	srv *server
	mux *http.ServeMux
}

// token is the bearer token mutating calls need: the value of the variable
// env, read when it was set; "" disables them.
type token struct{ env, value string }

// New returns the admin API, with the token read from cfg.TokenEnv now.
func New(cfg Config) *API {
	s := &server{cfg: cfg}
	api := &API{srv: s, mux: http.NewServeMux()}
	api.SetTokenEnv(cfg.TokenEnv)
	mux := api.mux
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(cfg.Log.Handler(), slog.LevelError),
	}))
	mux.HandleFunc("GET /v1/policy", func(w http.ResponseWriter, r *http.Request) {
		if cfg.Sources.Policy == nil {
			writeError(w, http.StatusServiceUnavailable, "no policy loaded")
			return
		}
		writeJSON(w, http.StatusOK, cfg.Sources.Policy())
	})
	mux.HandleFunc("POST /v1/policy/reload", s.authorized(s.reload))
	mux.HandleFunc("GET /v1/pools", list(cfg.Sources.Pools))
	mux.HandleFunc("POST /v1/pools/reset", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		if cfg.Sources.ResetPools != nil {
			cfg.Sources.ResetPools()
		}
		cfg.Log.Info("all pools reset", "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
	}))
	mux.HandleFunc("POST /v1/pools/{id}/reset", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if cfg.Sources.ResetPool == nil || !cfg.Sources.ResetPool(id) {
			writeError(w, http.StatusNotFound, "no pool "+id)
			return
		}
		cfg.Log.Info("pool reset", "pool", id, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, map[string]string{"status": "reset", "id": id})
	}))
	mux.HandleFunc("GET /v1/breakers", list(cfg.Sources.Breakers))
	mux.HandleFunc("GET /v1/tenants", s.tenants)
	mux.HandleFunc("GET /v1/bridges", list(cfg.Sources.Bridges))
	mux.HandleFunc("GET /v1/semaphores", list(cfg.Sources.Semaphores))
	mux.HandleFunc("GET /v1/queues", list(cfg.Sources.Queues))
	return api
}

// ServeHTTP serves the admin API.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// SetTokenEnv makes the value of the environment variable env, read now,
// the bearer token of mutating calls from the next request on; an unset
// or empty variable (or env "") disables them. The app calls it with
// admin.token_env at start and at each reload it applies: the value is a
// snapshot, not looked up per request, so what the policy says is what
// is checked.
func (a *API) SetTokenEnv(env string) {
	t := &token{env: env}
	if env != "" {
		// Whitespace around the value cannot be part of a token: HTTP
		// strips it from the header, so it could never match. A secret
		// mounted from a file usually ends in a newline.
		t.value = strings.TrimSpace(os.Getenv(env))
	}
	a.srv.tok.Store(t)
}

type server struct {
	cfg Config
	tok atomic.Pointer[token]
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Sources.Ready != nil {
		if err := s.cfg.Sources.Ready(); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	if s.cfg.Sources.Degraded != nil {
		if d := s.cfg.Sources.Degraded(); len(d) > 0 {
			writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "degraded": d})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// reloadAnswer is the body of POST /v1/policy/reload when the reloaded
// policy was put in force: the policy status, with "status" "applied", or
// "applied_with_errors" and the components' errors.
type reloadAnswer struct {
	Status string   `json:"status"`
	Errors []string `json:"errors,omitempty"`
	PolicyStatus
}

// reload answers 200 whenever the file's policy is in force afterwards,
// because the hash, the pools and every other figure the API shows then
// are the new policy's; "applied_with_errors" says which components kept
// their previous settings. 422 ("rejected") means nothing changed: the
// file did not load or validate.
func (s *server) reload(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Sources.Reload == nil {
		writeError(w, http.StatusServiceUnavailable, "reload unavailable")
		return
	}
	err := s.cfg.Sources.Reload()
	var partial *PartialApplyError
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, reloadAnswer{Status: "applied", PolicyStatus: s.cfg.Sources.Policy()})
	case errors.As(err, &partial):
		writeJSON(w, http.StatusOK, reloadAnswer{Status: "applied_with_errors", Errors: errorLines(err), PolicyStatus: s.cfg.Sources.Policy()})
	default:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"status": "rejected", "errors": errorLines(err)})
	}
}

// errorLines splits joined errors (and policy.Errors) one per line.
func errorLines(err error) []string {
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// authorized enforces SPEC §8: every POST needs the bearer token; with no
// token configured mutating calls are disabled (403), so an admin port
// exposed by mistake cannot reset limits.
func (s *server) authorized(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok := s.tok.Load()
		if tok.value == "" {
			writeError(w, http.StatusForbidden, "mutating admin calls are disabled: "+tokenName(tok.env)+" held no token when the policy was applied")
			return
		}
		// The scheme is case-insensitive (RFC 9110 §11.1): "bearer" is as
		// good as "Bearer"; one or more spaces may follow it (§11.4).
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		got = strings.TrimLeft(got, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || !constantTimeEqual(got, tok.value) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="warden-admin"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		next(w, r)
	}
}

func tokenName(env string) string {
	if env == "" {
		return "admin.token_env"
	}
	return env
}

func constantTimeEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// list serves a list source, written element by element (writeList); a
// nil source or slice is [].
func list[T any](src func() []T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var rows []T
		if src != nil {
			rows = src()
		}
		writeList(w, http.StatusOK, rows)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil && !errors.Is(err, http.ErrHandlerTimeout) {
		return // the client went away; nothing to tell it
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
