-- The mirror poll's prune of the registry slot (contract §6), every third of a lease on every
-- node: what the next registration would prune, without one.
--
-- KEYS[1]  sessions      KEYS[2] clients        KEYS[3] bind:hosts
-- KEYS[4]  bind:envs     KEYS[5] bind:quarantine
-- ARGV[1]  lease TTL (ms)
--
-- Returns the number of session records pruned. Their copies and namespace-list entries go
-- with each bucket's own prune (bucket_worker.lua, op 'prune').
local pruned = prune_registry(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], tonumber(ARGV[1]),
  now_ms(), {}, {})
return #pruned
