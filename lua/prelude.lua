-- Prepended to every script at build time (src/store/scripts.rs): helpers the scripts share.
-- No key name lives here or in any script: every key a script touches arrives in KEYS, named
-- by src/store/keys.rs, so that Redis Cluster can refuse a script whose keys a slot migration
-- has split (ASK, then TRYAGAIN) instead of running it against half of them.

-- Redis's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

