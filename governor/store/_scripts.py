"""The Lua script that keeps the shared admission ledger on Redis, atomically.

One script serves every operation (``ARGV[5]`` names it), so each runs the same prelude
first: the store's epoch (a store that restarted empty is noticed by the first process
that knew the old one), and the reaping of processes whose heartbeat deadline passed
(their leases' reservations return and their engine budgets are handed, once, to the
caller to close). Time is the Redis server's (``TIME``), one clock for every process and
machine. The layout of the keys, under the store's prefix ``P`` (``kvgov:{ns}:``):

- ``P meta`` (hash): ``limit`` (blocks admission may reserve), ``reserved`` and
  ``held_idle`` (the ledger), ``active``, ``peak``, the caps, ``epoch``, ``born``,
  ``ttl_ms``, ``last_op``, ``recover_until``.
- ``P queue`` (sorted set): waiting lease ids by rank, ``queued_at / aging_s - priority``
  on the server's clock (``PriorityWithAging``'s key, across processes).
- ``P procs`` (sorted set): process ids by heartbeat deadline (ms).
- ``P proc:<id>`` (set): the lease ids of a process.
- ``P lease:<id>`` (hash): ``state`` (``w`` waiting, ``a`` active, ``p`` parked), ``own``
  (blocks reserved while active), ``held`` (blocks its retained KV holds), ``agent``,
  ``tenant``, ``parent``, ``proc``, ``again`` (admitted before), ``budget`` (its engine
  budget may be open).
- ``P agents``, ``P tenants`` (hashes): active leases per agent name and tenant.
- ``P closing`` (sorted set): reaped leases whose engine budget the reaper is closing, by
  the deadline after which their room returns even unconfirmed; until then it stays
  counted, so no lease is admitted into blocks an engine budget still holds.
- ``P tools`` (set), ``P tool:<name>`` (hash: ``n``, ``mean``) and ``P tool:<name>:recent``
  (list, newest first): each tool's call durations, of every process.
- channels ``P admitted:<process>`` (the space-separated ids of its leases another
  process's operation admitted) and ``P expired`` (a process id).

The reply: ``{status, epoch, restarted, closing ids, admitted ids, value}``.
"""

from __future__ import annotations

__all__ = ["SCRIPT"]

SCRIPT = r"""
local P, proc, known, ttl, op = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local M, Q, PR = P .. 'meta', P .. 'queue', P .. 'procs'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function n(v) return tonumber(v) or 0 end
local closing, admitted = {}, {}

-- the epoch: a caller that knew another one has seen the store restart empty; admission
-- waits one TTL from the new epoch's birth, so every live process re-registers first
local epoch = redis.call('HGET', M, 'epoch')
if not epoch then
  epoch = tostring(now) .. '-' .. proc
  redis.call('HSET', M, 'epoch', epoch, 'born', now, 'last_op', now)
end
local restarted = 0
if known ~= '' and known ~= epoch then
  restarted = 1
  local born = n(redis.call('HGET', M, 'born'))
  if now - born < ttl and n(redis.call('HGET', M, 'recover_until')) < born + ttl then
    redis.call('HSET', M, 'recover_until', born + ttl)
  end
end
local ttl_store = math.max(ttl, n(redis.call('HGET', M, 'ttl_ms')))
-- nobody reached the store for a TTL (an outage): every process gets one TTL to come back
if now - n(redis.call('HGET', M, 'last_op')) > ttl_store then
  for _, p in ipairs(redis.call('ZRANGE', PR, 0, -1)) do
    redis.call('ZADD', PR, 'GT', now + ttl_store, p)
  end
end
redis.call('HSET', M, 'last_op', now, 'ttl_ms', ttl_store)

local function lkey(id) return P .. 'lease:' .. id end
local function fields(id)
  local v = redis.call('HMGET', lkey(id), 'state', 'own', 'held', 'agent', 'tenant', 'proc',
    'budget', 'again')
  if not v[1] then return nil end
  return {state = v[1], own = n(v[2]), held = n(v[3]), agent = v[4] or '', tenant = v[5] or '',
    proc = v[6] or '', budget = v[7], again = v[8]}
end
local function count(key, name, change)
  if name == '' then return end
  if redis.call('HINCRBY', key, name, change) <= 0 then redis.call('HDEL', key, name) end
end
local function activate(id, f)
  redis.call('HINCRBY', M, 'reserved', f.own)
  redis.call('HINCRBY', M, 'held_idle', 0 - f.held)
  local active = redis.call('HINCRBY', M, 'active', 1)
  if active > n(redis.call('HGET', M, 'peak')) then redis.call('HSET', M, 'peak', active) end
  count(P .. 'agents', f.agent, 1)
  count(P .. 'tenants', f.tenant, 1)
  redis.call('HSET', lkey(id), 'state', 'a', 'again', '1')
end
local function deactivate(id, f, state)
  redis.call('HINCRBY', M, 'reserved', 0 - f.own)
  redis.call('HINCRBY', M, 'held_idle', f.held)
  redis.call('HINCRBY', M, 'active', -1)
  count(P .. 'agents', f.agent, -1)
  count(P .. 'tenants', f.tenant, -1)
  redis.call('HSET', lkey(id), 'state', state)
  f.state = state
end
local function drop(id)
  local f = fields(id)
  if not f then return nil end
  if f.state == 'a' then deactivate(id, f, 'p') end
  redis.call('HINCRBY', M, 'held_idle', 0 - f.held)
  if f.state == 'w' then redis.call('ZREM', Q, id) end
  redis.call('DEL', lkey(id))
  redis.call('SREM', P .. 'proc:' .. f.proc, id)
  return f
end

-- reap the processes whose heartbeat deadline passed: a lease without an engine budget
-- goes at once; one with a budget keeps its room until the caller, handed the budget to
-- close, says it closed it ('closed'), or until a deadline long past any close
local CL = P .. 'closing'
local reaped = {}
for _, p in ipairs(redis.call('ZRANGEBYSCORE', PR, '-inf', now, 'LIMIT', 0, 32)) do
  reaped[#reaped + 1] = p
  for _, id in ipairs(redis.call('SMEMBERS', P .. 'proc:' .. p)) do
    local f = fields(id)
    if f and f.budget == '1' then
      if f.state == 'w' then
        redis.call('ZREM', Q, id)
        redis.call('HSET', lkey(id), 'state', 'p')
      end
      redis.call('ZADD', CL, now + 20 * ttl_store, id)
      closing[#closing + 1] = id
    else
      drop(id)
    end
  end
  redis.call('DEL', P .. 'proc:' .. p)
  redis.call('ZREM', PR, p)
  redis.call('PUBLISH', P .. 'expired', p)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', CL, '-inf', now, 'LIMIT', 0, 32)) do
  drop(id)  -- nobody said it closed: its room returns all the same
  redis.call('ZREM', CL, id)
  reaped[#reaped + 1] = id
end

local function verdict(f, limit)
  local most = n(redis.call('HGET', M, 'max_concurrent'))
  if most > 0 and n(redis.call('HGET', M, 'active')) >= most then return 'memory' end
  local cap = n(redis.call('HGET', M, 'max_per_agent'))
  if cap > 0 and n(redis.call('HGET', P .. 'agents', f.agent)) >= cap then return 'cap' end
  cap = n(redis.call('HGET', M, 'max_per_tenant'))
  if cap > 0 and f.tenant ~= '' and n(redis.call('HGET', P .. 'tenants', f.tenant)) >= cap then
    return 'cap'
  end
  local committed = n(redis.call('HGET', M, 'reserved')) + n(redis.call('HGET', M, 'held_idle'))
  if committed + f.own <= limit then return 'ok' end
  return 'memory'
end
local function pump()
  local limit = redis.call('HGET', M, 'limit')
  if not limit or now < n(redis.call('HGET', M, 'recover_until')) then return end
  limit = tonumber(limit)
  for _, id in ipairs(redis.call('ZRANGE', Q, 0, 511)) do
    local f = fields(id)
    if not f then
      redis.call('ZREM', Q, id)
    else
      local v = verdict(f, limit)
      if v == 'memory' then break end
      if v == 'ok' then
        activate(id, f)
        redis.call('ZREM', Q, id)
        admitted[#admitted + 1] = id
      end
    end
  end
  -- each process hears its own admissions on its own channel; the caller's are in its reply
  local by_proc = {}
  for _, id in ipairs(admitted) do
    local owner = redis.call('HGET', lkey(id), 'proc')
    if owner and owner ~= proc then
      by_proc[owner] = by_proc[owner] or {}
      table.insert(by_proc[owner], id)
    end
  end
  for owner, ids in pairs(by_proc) do
    redis.call('PUBLISH', P .. 'admitted:' .. owner, table.concat(ids, ' '))
  end
end
if #reaped > 0 then pump() end  -- the room of the reaped leases goes to the queue
local function reply(status, value)
  return {status, epoch, restarted, closing, admitted, value or 0}
end

if op == 'register' then
  redis.call('ZADD', PR, now + ttl, proc)
  redis.call('HSET', M, 'max_concurrent', ARGV[6], 'max_per_agent', ARGV[7],
    'max_per_tenant', ARGV[8])
  return reply('ok')
end
if op == 'counts' then
  local v = redis.call('HMGET', M, 'active', 'peak', 'reserved', 'held_idle', 'limit')
  return reply('ok', {n(v[1]), redis.call('ZCARD', Q), n(v[2]), n(v[3]), n(v[4]), n(v[5])})
end
if op == 'ledger' then
  local reserved, held = 0, 0
  for _, p in ipairs(redis.call('ZRANGE', PR, 0, -1)) do
    for _, id in ipairs(redis.call('SMEMBERS', P .. 'proc:' .. p)) do
      local f = fields(id)
      if f and f.state == 'a' then reserved = reserved + f.own end
      if f and f.state ~= 'a' then held = held + f.held end
    end
  end
  local v = redis.call('HMGET', M, 'reserved', 'held_idle')
  return reply('ok', {n(v[1]), reserved, n(v[2]), held})
end
if op == 'closed' then
  -- the engine budgets of reaped leases, closed by the caller: their room returns
  for i = 6, #ARGV do
    if redis.call('ZREM', CL, ARGV[i]) == 1 then drop(ARGV[i]) end
  end
  pump()
  return reply('ok')
end
if op == 'tool' then
  -- a tool call's seconds, into every process's history of that tool
  local name, seconds, window = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
  local key = P .. 'tool:' .. name
  local calls = redis.call('HINCRBY', key, 'n', 1)
  local mean = n(redis.call('HGET', key, 'mean'))
  redis.call('HSET', key, 'mean', tostring(mean + (seconds - mean) / calls))
  redis.call('LPUSH', key .. ':recent', ARGV[7])
  redis.call('LTRIM', key .. ':recent', 0, window - 1)
  redis.call('SADD', P .. 'tools', name)
  return reply('ok')
end
if op == 'tools' then
  local out = {}
  for _, name in ipairs(redis.call('SMEMBERS', P .. 'tools')) do
    local key = P .. 'tool:' .. name
    local v = redis.call('HMGET', key, 'n', 'mean')
    out[#out + 1] = {name, v[1] or '0', v[2] or '0', redis.call('LRANGE', key .. ':recent', 0, -1)}
    if #out >= 256 then break end
  end
  return reply('ok', out)
end
if op == 'capacity' then
  redis.call('HSET', M, 'limit', ARGV[6])
  pump()
  return reply('ok')
end
if not redis.call('ZSCORE', PR, proc) then
  return reply('expired')  -- this process was reaped: its leases are gone
end
if op == 'leave' then
  -- this process closes: its deadline is now, so the next operation of any process reaps
  -- what it still holds (and closes those budgets) without waiting out its TTL
  redis.call('ZADD', PR, now - 1, proc)
  return reply('ok')
end
if op == 'heartbeat' then
  redis.call('ZADD', PR, now + ttl, proc)
  local active = {}
  for i = 6, #ARGV do
    local f = fields(ARGV[i])
    if f and f.state == 'a' then active[#active + 1] = ARGV[i] end
  end
  pump()  -- after a recovery window, or anything that made room without a pass
  return reply('ok', active)
end
if op == 'restore' then
  -- the leases of this process, re-registered in a store that restarted empty:
  -- id, state, own, held, agent, tenant, parent, rank, budget (9 values each)
  redis.call('ZADD', PR, now + ttl, proc)
  for i = 6, #ARGV, 9 do
    local id = ARGV[i]
    if not fields(id) then
      local f = {state = ARGV[i + 1], own = n(ARGV[i + 2]), held = n(ARGV[i + 3]),
        agent = ARGV[i + 4], tenant = ARGV[i + 5]}
      redis.call('HSET', lkey(id), 'state', 'p', 'own', f.own, 'held', f.held, 'agent', f.agent,
        'tenant', f.tenant, 'parent', ARGV[i + 6], 'proc', proc, 'again', '1',
        'budget', ARGV[i + 8])
      redis.call('SADD', P .. 'proc:' .. proc, id)
      redis.call('HINCRBY', M, 'held_idle', f.held)
      if f.state == 'a' then
        activate(id, f)  -- running: counted, whatever the limit says
      elseif f.state == 'w' then
        redis.call('HSET', lkey(id), 'state', 'w')
        redis.call('ZADD', Q, ARGV[i + 7], id)
      end
    end
  end
  pump()
  return reply('ok')
end

local id = ARGV[6]
local f = fields(id)
if op == 'enqueue' then
  -- own, held, agent, tenant, parent, priority, aging_s, again
  local own, held = n(ARGV[7]), n(ARGV[8])
  if not f then
    if ARGV[14] == '1' then return reply('gone') end  -- admitted before, reaped since
    redis.call('HSET', lkey(id), 'state', 'w', 'own', own, 'held', held, 'agent', ARGV[9],
      'tenant', ARGV[10], 'parent', ARGV[11], 'proc', proc, 'again', '0')
    redis.call('SADD', P .. 'proc:' .. proc, id)
    redis.call('HINCRBY', M, 'held_idle', held)
  elseif f.state == 'a' then
    return reply('ok', 1)
  else
    redis.call('HSET', lkey(id), 'state', 'w', 'own', own)
  end
  local rank = now / 1000 / tonumber(ARGV[13]) - tonumber(ARGV[12])
  redis.call('ZADD', Q, rank, id)
  pump()
  f = fields(id)
  return reply('ok', (f and f.state == 'a') and 1 or 0)
end
if not f then return reply('gone') end
if op == 'cancel' then
  if f.state ~= 'w' then return reply('ok', f.state == 'a' and 2 or 0) end
  redis.call('ZREM', Q, id)
  if f.again == '1' then redis.call('HSET', lkey(id), 'state', 'p') else drop(id) end
  pump()
  return reply('ok', 1)
end
if op == 'release' then
  drop(id)
  pump()
  return reply('ok')
end
if op == 'park' then
  local parked = f.state == 'a'
  if parked then deactivate(id, f, 'p') end
  if ARGV[7] ~= '' and f.state ~= 'w' then redis.call('HSET', lkey(id), 'own', ARGV[7]) end
  if parked then pump() end
  return reply('ok', parked and 1 or 0)
end
if op == 'grow' then
  if f.state ~= 'a' then return reply('ok', 0) end
  local own = n(ARGV[7])
  local limit = n(redis.call('HGET', M, 'limit'))
  local committed = n(redis.call('HGET', M, 'reserved')) + n(redis.call('HGET', M, 'held_idle'))
  if committed - f.own + own > limit then return reply('ok', 0) end
  redis.call('HINCRBY', M, 'reserved', own - f.own)
  redis.call('HSET', lkey(id), 'own', own)
  return reply('ok', 1)
end
if op == 'held' then
  local blocks = n(ARGV[7])
  redis.call('HSET', lkey(id), 'held', blocks)
  if f.state ~= 'a' then
    redis.call('HINCRBY', M, 'held_idle', blocks - f.held)
    if blocks < f.held then pump() end
  end
  return reply('ok')
end
if op == 'budget' then
  redis.call('HSET', lkey(id), 'budget', '1')
  return reply('ok')
end
return redis.error_reply('kvgov store: unknown operation ' .. op)
"""
