-- Prepended to every script at build time (src/store/scripts.rs): helpers the scripts share.
-- No key name lives here or in any script: every key a script touches arrives in KEYS, named
-- by src/store/keys.rs, so that Redis Cluster can refuse a script whose keys a slot migration
-- has split (ASK, then TRYAGAIN) instead of running it against half of them.

-- Redis's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end


-- A session's copy in a bucket, as its expiry (ms) and hostname: from its liveness entry
-- ('{expiry} {hostname}': hostnames hold no space), or from the copy itself when it has none
-- (a copy written before liveness entries existed); nil when the bucket has neither.
local function owner_of(alive, workers, sid)
  local live = redis.call('HGET', alive, sid)
  if live then
    local space = string.find(live, ' ', 1, true)
    return tonumber(string.sub(live, 1, space - 1)), string.sub(live, space + 1)
  end
  local copy = redis.call('HGET', workers, sid)
  if copy then
    copy = cjson.decode(copy)
    return copy.expiry, copy.hostname or ''
  end
end
