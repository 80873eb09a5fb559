-- The durability sweep's last step: an id whose owner answered its `_wake` with 200 leaves
-- the wake schedule, unless it was scheduled again meanwhile (a later wake-at than the one it
-- was woken for: the instance asked for another wake while it woke up). Atomic in the
-- bucket's slot.
--
-- KEYS[1]  the wake schedule of (env, ns)
-- ARGV[1]  id   ARGV[2] the wake-at (ms) it was woken for
--
-- Returns 1 when the entry went, else 0.
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
