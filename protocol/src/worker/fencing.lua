-- Compare-and-set by fencing token (the Pinboard worker libraries' Redis recipe).
-- KEYS[1]: a hash of two fields, `value` and `epoch`; ARGV[1]: the writer's placement epoch
-- (digits); ARGV[2]: the value. Writes only when the offered epoch is at least the stored one
-- (none stored: 0), both compared as digit strings: significant digits by length, then bytes,
-- so an epoch of any size compares exactly. Returns {1, offered} when written, {0, stored}
-- when refused (stale); an offered epoch that is not digits is an error.
local offered = string.match(ARGV[1], '^0*(%d+)$')
if not offered then
  return redis.error_reply('ERR malformed epoch')
end
local stored = redis.call('HGET', KEYS[1], 'epoch') or '0'
if #offered < #stored or (#offered == #stored and offered < stored) then
  return {0, stored}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'epoch', offered)
return {1, offered}
