package policy

import (
	"fmt"
	"net"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The `check` struct tag carries the rules the decoder applies to a single
// value as it decodes it, so that the schema in types.go states its own
// constraints. Rules that relate several values (references, duplicates,
// "exactly one of") live in validate.go.
//
// Every integer, number and duration must be non-negative unless `signed`.
// On a list or map field, the rules other than `required` apply to each
// element.
//
//	required       the key must be present (and, for strings, not empty)
//	signed         negative integers are allowed
//	min=N          integers must be at least N
//	ratio          numbers must lie in [0,1]
//	positive       numbers and durations must be greater than 0
//	oneof=a|b      strings must be one of the listed words
//	url=s1|s2      strings must be absolute URLs with one of these schemes,
//	               a host, and no path, query or fragment
//	listen         host:port to listen on; empty host = all interfaces,
//	               port 0-65535
//	hostport       host:port to connect to; host required, port 1-65535
//	host           a host name or IP, optionally with :port
//	service        a fully-qualified gRPC service name (pkg.v1.Service)
//	path           a URL path starting with '/'
//	name           a name used in URLs and metric labels
//	env            an environment variable name
//	header         an HTTP header name
//	nonempty       strings must not be empty
type checks struct {
	required, signed, ratio, positive, nonempty bool
	min                                         int
	oneof, schemes                              []string
	format                                      string
}

// elem is the rules for each element of a list or map field.
func (c checks) elem() checks {
	c.required = false
	return c
}

func parseChecks(tag string) checks {
	var c checks
	if tag == "" {
		return c
	}
	for _, rule := range strings.Split(tag, ",") {
		name, arg, _ := strings.Cut(rule, "=")
		switch name {
		case "required":
			c.required = true
		case "signed":
			c.signed = true
		case "ratio":
			c.ratio = true
		case "positive":
			c.positive = true
		case "nonempty":
			c.nonempty = true
		case "min":
			n, err := strconv.Atoi(arg)
			if err != nil {
				panic("policy: bad check tag " + tag)
			}
			c.min = n
		case "oneof":
			c.oneof = strings.Split(arg, "|")
		case "url":
			c.schemes = strings.Split(arg, "|")
		case "listen", "hostport", "host", "service", "path", "name", "env", "header":
			c.format = name
		default:
			// The tags are this package's own; a typo in one is a bug here.
			panic("policy: unknown check " + rule)
		}
	}
	return c
}

// checkString returns what is wrong with s under c, or "".
func (c checks) checkString(s string) string {
	if s == "" {
		if c.required || c.nonempty || c.format != "" || c.schemes != nil || c.oneof != nil {
			return "must not be empty"
		}
		return ""
	}
	if c.oneof != nil && !slices.Contains(c.oneof, s) {
		return fmt.Sprintf("%q is not one of %s", s, strings.Join(c.oneof, ", "))
	}
	if c.schemes != nil {
		if err := checkURL(s, c.schemes, false); err != nil {
			return err.Error()
		}
	}
	var err error
	switch c.format {
	case "listen":
		_, _, err = checkListen(s)
	case "hostport":
		err = checkHostPort(s)
	case "host":
		err = checkHost(s)
	case "service":
		if !serviceRE.MatchString(s) {
			err = fmt.Errorf("%q is not a gRPC service name such as payments.v1.Payments", s)
		}
	case "path":
		if !strings.HasPrefix(s, "/") {
			err = fmt.Errorf("%q must start with '/'", s)
		} else if strings.ContainsAny(s, "?# \t") {
			err = fmt.Errorf("%q must be a plain path, without query, fragment or spaces", s)
		}
	case "name":
		err = checkName(s)
	case "env":
		if !envRE.MatchString(s) {
			err = fmt.Errorf("%q is not an environment variable name", s)
		}
	case "header":
		if !headerRE.MatchString(s) {
			err = fmt.Errorf("%q is not an HTTP header name", s)
		}
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	envRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	headerRE  = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
	serviceRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	hostRE    = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?$`)
)

// checkName: names appear in admin URLs (/v1/pools/{id}/reset) and metric
// labels, so they are restricted to characters that need no escaping there.
func checkName(s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("name %q must be letters, digits, '.', '_' or '-', starting with a letter or digit", s)
	}
	return nil
}

// checkListen parses a listen address; an empty host means every interface.
func checkListen(s string) (host string, port int, err error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		if _, numErr := strconv.Atoi(s); numErr == nil {
			return "", 0, fmt.Errorf("%q is not host:port (did you mean \":%s\"?)", s, s)
		}
		return "", 0, fmt.Errorf("%q is not host:port", s)
	}
	port, err = parsePort(ps, 0)
	if err != nil {
		return "", 0, err
	}
	return host, port, nil
}

func checkHostPort(s string) error {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port", s)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", s)
	}
	_, err = parsePort(ps, 1)
	return err
}

// checkHost checks one targets[].hosts entry: `host` or `host:port`.
func checkHost(s string) error {
	if strings.Contains(s, "://") || strings.Contains(s, "/") {
		return fmt.Errorf("%q is not a host; write the host name only (api.stripe.com or api.stripe.com:443)", s)
	}
	host := s
	if h, ps, err := net.SplitHostPort(s); err == nil {
		if _, err := parsePort(ps, 1); err != nil {
			return err
		}
		host = h
	}
	if net.ParseIP(host) != nil || hostRE.MatchString(host) {
		return nil
	}
	return fmt.Errorf("%q is not a host name or IP address", s)
}

func parsePort(ps string, lowest int) (int, error) {
	n, err := strconv.Atoi(ps)
	if err != nil || ps == "" || ps[0] < '0' || ps[0] > '9' || n < lowest || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number in %d-65535", ps, lowest)
	}
	return n, nil
}

// checkURL checks an absolute URL's scheme and host. Origins (upstream,
// worker) take no path: the proxy forwards the caller's path as is, and a
// path here would be silently ignored. Connection URLs (redis, postgres)
// may carry a path, query and user.
func checkURL(s string, schemes []string, connection bool) error {
	shown := RedactURL(s)
	if !strings.Contains(s, "://") && !(connection && strings.HasPrefix(s, "unix:")) {
		return fmt.Errorf("%q has no scheme (write %s://%s)", shown, schemes[0], shown)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL", shown)
	}
	if u.Scheme == "" {
		return fmt.Errorf("%q has no scheme (write %s://%s)", shown, schemes[0], shown)
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("%q: scheme %q is not one of %s", shown, u.Scheme, strings.Join(schemes, ", "))
	}
	if connection {
		return nil
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("%q has no host", shown)
	}
	if p := u.Port(); p != "" {
		if _, err := parsePort(p, 1); err != nil {
			return fmt.Errorf("%q: %v", shown, err)
		}
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q must be an origin (scheme://host[:port]) without path, query, user or fragment", shown)
	}
	return nil
}

// checkRedisURL parses a backend URL the way the Redis client will, so
// that what validate accepts, warden run can open (a database number,
// the options go-redis knows).
func checkRedisURL(s string) error {
	if err := checkURL(s, []string{"redis", "rediss", "unix"}, true); err != nil {
		return err
	}
	if _, err := redis.ParseURL(s); err != nil {
		return fmt.Errorf("%q: %v", RedactURL(s), err)
	}
	return nil
}

// checkPostgresURL parses a run-store URL the way the store will
// (pgxpool, pool_* parameters included). pgx's errors already hide the
// password.
func checkPostgresURL(s string) error {
	if err := checkURL(s, []string{"postgres", "postgresql"}, true); err != nil {
		return err
	}
	if _, err := pgxpool.ParseConfig(s); err != nil {
		return fmt.Errorf("%q: %v", RedactURL(s), err)
	}
	return nil
}

// RedactURL is s with the password replaced by xxxxx, for errors and
// logs: a policy's backend and store URLs may carry credentials, and
// errors reach the unauthenticated GET /v1/policy. A string that does not
// parse loses everything between "://" and its last '@'.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	i := strings.Index(s, "://")
	j := strings.LastIndexByte(s, '@')
	if i < 0 || j < i {
		return s
	}
	return s[:i+3] + "xxxxx" + s[j:]
}

// schema is what the decoder needs to know about one struct type.
type schema struct {
	fields    []field
	byName    map[string]field
	nameField int // index of a `Name yaml:"-"` field filled from the mapping key, or -1
	posField  int // index of the Position field, or -1
}

type field struct {
	name   string
	index  int
	checks checks
}

func (s schema) names() []string {
	out := make([]string, len(s.fields))
	for i, f := range s.fields {
		out[i] = f.name
	}
	return out
}

// schemaOf reads t's yaml and check tags. The decoder keeps what it reads
// for the length of one Parse (decoder.schema), since a file of 100,000
// tenants decodes as many structs; a cache across calls would be global
// mutable state.
func schemaOf(t reflect.Type) schema {
	s := schema{byName: map[string]field{}, nameField: -1, posField: -1}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		switch {
		case sf.Type == positionType:
			s.posField = i
			continue
		case name == "-" && sf.Name == "Name" && sf.Type.Kind() == reflect.String:
			s.nameField = i
			continue
		case name == "" || name == "-":
			continue
		}
		f := field{name: name, index: i, checks: parseChecks(sf.Tag.Get("check"))}
		s.fields = append(s.fields, f)
		s.byName[name] = f
	}
	return s
}

// yamlName is the yaml key of struct field sf, or "" if it has none.
func yamlName(sf reflect.StructField) string {
	name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}
