-- Helpers the scripts share. Each script gets, in front of it, the ones it names (and those
-- they name: src/store/scripts.rs): a `local function` is a closure Redis makes on every call.
-- No key name lives here or in any script: every key a script touches arrives in KEYS, named
-- by src/store/keys.rs, so that Redis Cluster can refuse a script whose keys a slot migration
-- has split (ASK, then TRYAGAIN) instead of running it against half of them.

-- Redis's clock in milliseconds. TIME's strings are converted by the arithmetic itself: two
-- calls of `tonumber` cost a steady resolve more than the rest of this line.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- Epochs (binding and placement) are decimal digit strings without leading zeros, compared as
-- integers of any size and never through a Lua number: a double holds 2^53 exactly, and cjson
-- writes one with 14 significant digits. A number an older node stored reads as its decimal.
local function epoch_digits(e)
  if type(e) == 'number' then
    return string.format('%.0f', e)
  end
  return e
end

-- -1, 0 or 1 as epoch `a` is below, equal to or above `b`.
local function epoch_cmp(a, b)
  a, b = epoch_digits(a), epoch_digits(b)
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  if a == b then
    return 0
  end
  return a < b and -1 or 1
end

-- Epoch `e` + 1, in digits.
local function epoch_next(e)
  e = epoch_digits(e)
  local i = #e
  while i > 0 and string.sub(e, i, i) == '9' do
    i = i - 1
  end
  if i == 0 then
    return '1' .. string.rep('0', #e)
  end
  return string.sub(e, 1, i - 1) .. string.char(string.byte(e, i) + 1) .. string.rep('0', #e - i)
end

-- The larger of epochs `a` and `b`.
local function epoch_max(a, b)
  if epoch_cmp(a, b) >= 0 then
    return a
  end
  return b
end

-- A session's copy in a bucket, as its expiry (ms) and, when `with_hostname`, its hostname:
-- from its liveness entry ('{expiry} {hostname}': hostnames hold no space), or from the copy
-- itself when it has none (a copy written before liveness entries existed); nil when the
-- bucket has neither. (A single-mode resolve has no use for the hostname's substring.)
local function owner_of(alive, workers, sid, with_hostname)
  local live = redis.call('HGET', alive, sid)
  if live then
    local space = string.find(live, ' ', 1, true)
    return tonumber(string.sub(live, 1, space - 1)), with_hostname and string.sub(live, space + 1)
  end
  local copy = redis.call('HGET', workers, sid)
  if copy then
    copy = cjson.decode(copy)
    return copy.expiry, copy.hostname or ''
  end
end

-- The ownerless placeholder a row leaves when its owner goes (a release, the sweeper's GC of a
-- dead owner's row, the durability sweep's retirement of one), or nil when it leaves none: a
-- pause outlives its owner, so that no node places the id while it is paused; with
-- `keep_move`, so does a move's successor (`mv`) with the move's fence, so that the next
-- placement still goes to the successor. The row's hostname stays (the resurrection target).
local function placeholder_of(row, keep_move)
  local mv = keep_move and row.mv or nil
  if not row.paused and not mv then
    return nil
  end
  return {sessionId = '', hostname = row.hostname, paused = row.paused, mv = mv,
    expiry = mv and row.expiry or nil}
end

-- The field of (env, ns, id) in a bucket's `ledger:last` hash: NUL between the three, which
-- no env, namespace or id holds (src/store/keys.rs).
local function ledger_field(env, ns, id)
  return env .. '\0' .. ns .. '\0' .. id
end

-- The ownership ledger (src/store/README.md): appends one entry for a change of the owner or
-- the fence of (env, ns, id) to the bucket's stream, capped near `max` entries
-- (`XADD … MAXLEN ~`), and points the id's field of the bucket's `last` hash at it. Each entry
-- names the id's entry before it (`prev`), so one id's history is a chain walked from `last`,
-- never a scan of the stream. Its time is the stream ID's: Redis's clock, as `now_ms`, kept
-- monotonic by XADD. `ledger` is {stream, last, max}; `max` '' is the ledger off: nothing is
-- written. `from` and `to` are session ids ('' for none), `extra` nil or a list of further
-- field-value pairs (`by`: an operator's sub; `fence`: the wind-down expiry ms set, '' for
-- one cleared).
local function ledger_append(ledger, env, ns, id, epoch, from, to, reason, extra)
  if ledger[3] == '' then
    return
  end
  local field = ledger_field(env, ns, id)
  -- The entry's field names in double quotes: single-quoted, `epoch` would read as a key's
  -- name to src/store/scripts.rs's check that no script spells one.
  local entry = {'XADD', ledger[1], 'MAXLEN', '~', ledger[3], '*',
    "env", env, "ns", ns, "id", id, "epoch", epoch_digits(epoch), "reason", reason}
  if from ~= '' then
    entry[#entry + 1] = "from"
    entry[#entry + 1] = from
  end
  if to ~= '' then
    entry[#entry + 1] = "to"
    entry[#entry + 1] = to
  end
  local prev = redis.call('HGET', ledger[2], field)
  if prev then
    entry[#entry + 1] = "prev"
    entry[#entry + 1] = prev
  end
  for _, value in ipairs(extra or {}) do
    entry[#entry + 1] = value
  end
  redis.call('HSET', ledger[2], field, redis.call(unpack(entry)))
end

-- The registry's prune (spec: "pruned once expiry + lease < now, together with bindings
-- without a live worker"): deletes the session records dead for more than a lease (and their
-- client's pointer to them), then every host and env binding no live session uses and none of
-- `hosts_wanted` / `envs_wanted` ([[name, ...], ...]) names. Returns the pruned sessionIds.
local function prune_registry(sessions, clients, hosts, envs, quarantine, lease, now,
                              hosts_wanted, envs_wanted)
  local pruned = {}
  local live_hosts, live_envs = {}, {}
  local all = redis.call('HGETALL', sessions)
  for i = 1, #all, 2 do
    local s = cjson.decode(all[i + 1])
    if s.expiry + lease < now then
      redis.call('HDEL', sessions, all[i])
      pruned[#pruned + 1] = all[i]
      local c = redis.call('HGET', clients, s.clientId)
      if c and cjson.decode(c).sessionId == all[i] then
        redis.call('HDEL', clients, s.clientId)
      end
    elseif s.expiry > now and s.hostname then
      for _, ns in ipairs(s.namespaces) do
        live_hosts[s.hostname .. ns] = true
      end
      live_envs[s.env] = true
      for _, env in pairs(s.envs) do
        live_envs[env] = true
      end
    end
  end
  for _, w in ipairs(hosts_wanted) do live_hosts[w[1]] = true end
  for _, w in ipairs(envs_wanted) do live_envs[w[1]] = true end
  for _, key in ipairs(redis.call('HKEYS', hosts)) do
    if not live_hosts[key] then
      redis.call('HDEL', hosts, key)
      redis.call('HDEL', quarantine, key)
    end
  end
  for _, env in ipairs(redis.call('HKEYS', envs)) do
    if not live_envs[env] then
      redis.call('HDEL', envs, env)
    end
  end
  return pruned
end
