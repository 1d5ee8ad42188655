package redisx

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// gateLib is the Lua every admission script starts with. A gate kind is a
// pair of functions: <kind>_read consumes the gate's KEYS and ARGV through
// the cursors, reads its state and says whether it admits (g.ok) without
// writing anything; g.commit(g) applies it. A script reads every gate of an
// admission first and commits them only when all admit, so a refused
// admission leaves Redis untouched (envoyproxy/ratelimit#185).
//
// To add a gate kind (a lease in a sorted set, say): write lease_read
// setting g.ok, g.value and g.commit, add it to read_gate, add the Go
// encoder in op.go. Every key a gate touches is passed in KEYS.
const gateLib = `
local ki, ai = 0, 0
local function nextkey() ki = ki + 1; return KEYS[ki] end
local function nextarg() ai = ai + 1; return ARGV[ai] end
local function nextnum() ai = ai + 1; return tonumber(ARGV[ai]) end

-- window: a fixed-window counter whose key carries the window start.
-- KEYS: counter, index of the window's keys. ARGV: limit, n, ttl_ms, member.
-- The expiry is set once, when the key is created, with the window's end
-- (never an EXPIRE per hit: envoyproxy/ratelimit#72, #80, #595).
local function window_commit(g)
  if g.exists then
    g.value = redis.call('INCRBY', g.key, g.n)
    return
  end
  redis.call('SET', g.key, g.n, 'PX', g.ttl)
  g.value = g.n
  if redis.call('SADD', g.idx, g.member) == 1 and redis.call('SCARD', g.idx) == 1 then
    redis.call('PEXPIRE', g.idx, g.ttl)
  end
end

local function window_read()
  local g = {key = nextkey(), idx = nextkey()}
  g.limit, g.n, g.ttl, g.member = nextnum(), nextnum(), nextnum(), nextarg()
  local v = redis.call('GET', g.key)
  g.exists = v ~= false
  g.value = g.exists and tonumber(v) or 0
  g.ok = g.value + g.n <= g.limit
  g.commit = window_commit
  return g
end

local function read_gate(kind)
  if kind == 'w' then return window_read() end
  return redis.error_reply('warden: unknown gate kind ' .. tostring(kind))
end
`

// admitBody runs a batch of admissions. ARGV starts with the number of
// admissions; each admission is its gate count (negative: check only, never
// commit) followed by its gates, each a kind letter and the kind's
// arguments. The reply has one integer per gate, in order: value*2 + ok.
const admitBody = `
local out, o = {}, 0
for _ = 1, nextnum() do
  local ng = nextnum()
  local commit = ng > 0
  if ng < 0 then ng = -ng end
  local gates, all = {}, true
  for j = 1, ng do
    local g = read_gate(nextarg())
    if g.ok == nil then return g end
    gates[j] = g
    all = all and g.ok
  end
  if all and commit then
    for j = 1, ng do gates[j].commit(gates[j]) end
  end
  for j = 1, ng do
    o = o + 1
    out[o] = gates[j].value * 2 + (gates[j].ok and 1 or 0)
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
