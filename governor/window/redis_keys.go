package window

import (
	"strconv"
	"strings"
)

// Redis key layout (see README.md):
//
//	{prefix}{scope}:{window}:{start}:{key}   the window's counter (a string)
//	{prefix}{scope}:{window}:{start}#keys    the set of the window's keys
//
// scope is the scope name with '%' and ':' percent-escaped, window the size
// in seconds and start the window's start in unix seconds. The caller's key
// comes last, unescaped: since nothing before it can contain a ':', no key
// (whatever its bytes) can make two windows share a counter, and the index
// (whose third field is not all digits) never collides with a counter. Both
// expire at the window's end.

// DefaultRedisPrefix starts every key warden writes.
const DefaultRedisPrefix = "warden:"

// redisKeys is the cached key material of one scope's window.
type redisKeys struct {
	prefix string
	start  int64 // unix ns
	base   string
	index  string
}

// windowKeys returns the key parts of scope s's window starting at start
// (unix ns), cached on the scope for the current window.
func windowKeys(prefix string, s *Scope, start int64) *redisKeys {
	if k := s.redis.Load(); k != nil && k.start == start && k.prefix == prefix {
		return k
	}
	k := buildKeys(prefix, s, start)
	s.redis.Store(k)
	return k
}

func buildKeys(prefix string, s *Scope, start int64) *redisKeys {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteString(escapeScope(s.Name))
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(int(s.Window)))
	b.WriteByte(':')
	b.WriteString(strconv.FormatInt(start/1e9, 10))
	head := b.String()
	return &redisKeys{prefix: prefix, start: start, base: head + ":", index: head + "#keys"}
}

// counterKey is the counter of key in this window; the key itself is the
// suffix after len(k.base).
func (k *redisKeys) counterKey(key []byte) string { return k.base + string(key) }

var scopeEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

func escapeScope(name string) string {
	if !strings.ContainsAny(name, "%:") {
		return name
	}
	return scopeEscaper.Replace(name)
}
