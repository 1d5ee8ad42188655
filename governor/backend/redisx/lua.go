package redisx

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// gateLib is the Lua every admission script starts with: a table of gate
// kinds, each with how many KEYS and ARGV it consumes and three functions
// taking its first KEYS and ARGV index:
//
//	apply(k, a)     -> ok, value   take the gate if it admits; leave it as it was if not
//	undo(k, a, v)   -> value       give back what apply took (v is what apply returned)
//	peek(k, a)      -> ok, value   read only
//
// An admission applies its gates in order; the first refusal undoes the
// ones already applied and the rest are only peeked. Inside one script
// nothing else runs in between, so no client ever sees a refused admission
// counted (envoyproxy/ratelimit#185), and the common case — one gate that
// admits — costs a single redis.call. Redis's per-call cost inside Lua is
// what bounds warden's shared admissions per second, so the gates avoid
// tables and extra calls on that path.
//
// To add a gate kind (a lease in a sorted set, say): add gates.<letter>
// with its three functions, and its encoder in batch.go. Every key a gate
// touches must come in through KEYS.
const gateLib = `
local gates = {}

-- w: a fixed-window counter whose key carries the window start.
-- KEYS: counter, index of the window's keys. ARGV: limit, n, ttl_ms,
-- member, max_keys.
-- The expiry is set once, when this call creates the key, with the time
-- left in the window (never an EXPIRE per hit: envoyproxy/ratelimit#72,
-- #80, #595). A key created and refused in the same call is deleted. With
-- max_keys > 0, a key whose member would be the index's max_keys+1th is
-- not created: the gate refuses with value -1 (overflow).
gates.w = {keys = 2, args = 5}
function gates.w.apply(k, a)
  local key, n = KEYS[k], ARGV[a + 1]
  local v = redis.call('INCRBY', key, n)
  local d = tonumber(n)
  if v > tonumber(ARGV[a]) then
    if v == d then redis.call('DEL', key) else redis.call('DECRBY', key, n) end
    return false, v - d
  end
  if v == d and redis.call('PTTL', key) == -1 then
    local idx, ttl, cap = KEYS[k + 1], ARGV[a + 2], tonumber(ARGV[a + 4])
    if redis.call('SADD', idx, ARGV[a + 3]) == 1 then
      local c = redis.call('SCARD', idx)
      if cap > 0 and c > cap then
        redis.call('SREM', idx, ARGV[a + 3])
        redis.call('DEL', key)
        return false, -1
      end
      if c == 1 then redis.call('PEXPIRE', idx, ttl) end
    end
    redis.call('PEXPIRE', key, ttl)
  end
  return true, v
end
function gates.w.undo(k, a, v)
  local key, n = KEYS[k], ARGV[a + 1]
  local d = tonumber(n)
  if v == d then redis.call('DEL', key) else redis.call('DECRBY', key, n) end
  return v - d
end
function gates.w.peek(k, a)
  local v = tonumber(redis.call('GET', KEYS[k]) or '0')
  return v + tonumber(ARGV[a + 1]) <= tonumber(ARGV[a]), v
end

-- l: a lease set, holders scored by lease expiry (unix ms, sidecar time).
-- KEYS: the set. ARGV: limit, now_ms, expiry_ms, holder, ttl_ms.
-- apply sweeps the leases that expired (holders that died or stopped
-- renewing) before counting, so their slots return by themselves. The
-- set's own expiry is pushed to a lease from now on every take (and every
-- renewal), so a set nobody uses any more disappears.
gates.l = {keys = 1, args = 5}
function gates.l.apply(k, a)
  local key = KEYS[k]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[a + 1])
  local c = redis.call('ZCARD', key)
  if c >= tonumber(ARGV[a]) then return false, c end
  redis.call('ZADD', key, ARGV[a + 2], ARGV[a + 3])
  redis.call('PEXPIRE', key, ARGV[a + 4])
  return true, c + 1
end
function gates.l.undo(k, a, v)
  redis.call('ZREM', KEYS[k], ARGV[a + 3])
  return v - 1
end
function gates.l.peek(k, a)
  local c = redis.call('ZCOUNT', KEYS[k], '(' .. ARGV[a + 1], '+inf')
  return c < tonumber(ARGV[a]), c
end

-- r: give a lease back. KEYS: the set. ARGV: holder. Always admits (value:
-- 1 if the holder was there); travels alone in its op, so never undone.
-- Releasing twice, or after the lease expired, removes nothing.
gates.r = {keys = 1, args = 1}
function gates.r.apply(k, a) return true, redis.call('ZREM', KEYS[k], ARGV[a]) end
function gates.r.undo(k, a, v) return v end
function gates.r.peek(k, a) return true, 0 end
`

// admitBody runs a batch of admissions. ARGV[1] is the number of
// admissions; each is its gate count (negative: check only, apply nothing)
// followed by its gates, each a kind letter and the kind's arguments. The
// reply has one integer per gate, in order: value*2 + ok.
const admitBody = `
local ki, ai, o, out = 1, 2, 0, {}
local uk, ua, uv, ug, uo = {}, {}, {}, {}, {}
for _ = 1, tonumber(ARGV[1]) do
  local ng = tonumber(ARGV[ai])
  ai = ai + 1
  local refused = ng < 0
  if refused then ng = -ng end
  local m = 0
  for _ = 1, ng do
    local g = gates[ARGV[ai]]
    if g == nil then return redis.error_reply('warden: unknown gate kind ' .. tostring(ARGV[ai])) end
    local k, a = ki, ai + 1
    ki, ai = ki + g.keys, a + g.args
    local ok, v
    if refused then
      ok, v = g.peek(k, a)
    else
      ok, v = g.apply(k, a)
      if ok then
        m = m + 1
        uk[m], ua[m], uv[m], ug[m], uo[m] = k, a, v, g, o + 1
      else
        refused = true
        for i = 1, m do out[uo[i]] = ug[i].undo(uk[i], ua[i], uv[i]) * 2 + 1 end
      end
    end
    o = o + 1
    out[o] = v * 2 + (ok and 1 or 0)
  end
end
return out
`

// refundBody gives n back to an existing window counter, never below 0
// and never creating a key (so never one without an expiry).
// KEYS: counter. ARGV: n. Reply: the new count, or -1 when the key is gone.
const refundBody = `
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
local c = tonumber(v) - tonumber(ARGV[1])
if c < 0 then c = 0 end
redis.call('SET', KEYS[1], c, 'KEEPTTL')
return c
`

// renewBody extends held leases. KEYS: one lease set per lease (repeats
// allowed). ARGV: expiry_ms, ttl_ms, then one holder per key. A renewal
// only moves an expiry later: two renewals of a client can overlap (the
// renewer's and a RenewNow, or one delayed on its connection), and the one
// with the earlier expiry, landing last, must not shorten the lease. A
// lease that is gone (Redis restarted empty or lost it, or it expired
// because renewals failed for longer than the lease) is not touched here:
// the reply lists the 1-based positions of those, and the client adds back
// the ones it still holds (readdBody) — having checked, after this reply,
// that they were not released meanwhile.
const renewBody = `
local gone = {}
for i = 1, #KEYS do
  local at = redis.call('ZSCORE', KEYS[i], ARGV[i + 2])
  if at then
    if tonumber(at) < tonumber(ARGV[1]) then redis.call('ZADD', KEYS[i], ARGV[1], ARGV[i + 2]) end
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    gone[#gone + 1] = i
  end
end
return gone
`

// readdBody adds back leases Redis lost while their holders still run,
// whatever their sets hold: the set then counts what really runs, even
// past its limit, and admits nobody until enough of them end. KEYS and
// ARGV as renewBody; a lease added back meanwhile by an overlapping call
// keeps the later expiry. Reply: how many were added.
const readdBody = `
for i = 1, #KEYS do
  local at = redis.call('ZSCORE', KEYS[i], ARGV[i + 2])
  if not at or tonumber(at) < tonumber(ARGV[1]) then redis.call('ZADD', KEYS[i], ARGV[1], ARGV[i + 2]) end
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return #KEYS
`

// Script is a Lua script run with EVALSHA, falling back to EVAL when the
// server does not have it cached (first use, restart, SCRIPT FLUSH).
type Script struct {
	src, sha string
}

// NewScript returns the script made of the gate library and body.
func NewScript(body string) *Script {
	src := gateLib + body
	sum := sha1.Sum([]byte(src))
	return &Script{src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	admitScript  = NewScript(admitBody)
	refundScript = NewScript(refundBody)
	renewScript  = NewScript(renewBody)
	readdScript  = NewScript(readdBody)
)

// run executes the script; args is the whole command with its first two
// slots free for the verb and the digest: [_, _, numkeys, keys..., argv...].
func (s *Script) run(ctx context.Context, rdb *redis.Client, args []any) *redis.Cmd {
	args[0], args[1] = "evalsha", s.sha
	cmd := rdb.Do(ctx, args...)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", s.src
		cmd = rdb.Do(ctx, args...)
	}
	return cmd
}

// Refund gives n back to the window counter key, as operation "refund". It
// returns the new count, or -1 when the window's key no longer exists.
func (c *Client) Refund(key string, n int64) (int64, error) {
	var v int64
	err := c.Call("refund", func(ctx context.Context, rdb *redis.Client) error {
		var err error
		v, err = refundScript.run(ctx, rdb, []any{nil, nil, 1, key, n}).Int64()
		return err
	})
	return v, err
}
