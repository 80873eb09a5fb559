-- The sweeper forgets an (env, namespace) pair of the registry's list, atomic in the registry
-- slot: it found the pair holding nothing (no row, marker or wake entry in any bucket) and no
-- session record naming it. A registration that named the pair since the pass read the list
-- moved its count, and the pair stays.
--
-- KEYS[1]  namespaces (pair → registrations that named it)
-- ARGV[1]  the pair's field   ARGV[2] its count as the pass read it
--
-- Returns 1 when the pair was forgotten, else 0.
local namespaces, field, seen = KEYS[1], ARGV[1], ARGV[2]
if redis.call('HGET', namespaces, field) == seen then
  redis.call('HDEL', namespaces, field)
  return 1
end
return 0
