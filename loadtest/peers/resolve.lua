-- The nginx + Lua + Redis peer's resolve, run in Redis by EVALSHA (SCRIPT LOAD once): the
-- work of a steady-state Pinboard resolve of an id that is already placed, on the same keys.
--
-- KEYS[1]  bucket key prefix ("{prefix}{b}:"), b = first 8 hex digits of sha256(id) mod shards
-- ARGV[1]  env ("default")   ARGV[2] namespace   ARGV[3] id
--
-- Returns {'forward', sessionId, epoch, advertiseUrl, secret} while the placement row's owner
-- lives, else {'miss'} (no row: this peer places nothing) or {'dead'} (owner gone or expired).
local K = KEYS[1]
local raw = redis.call('HGET', K .. ARGV[1] .. ':' .. ARGV[2] .. ':placements', ARGV[3])
if not raw then
  return {'miss'}
end
local row = cjson.decode(raw)
local owner = redis.call('HGET', K .. 'workers', row.sessionId)
if not owner then
  return {'dead'}
end
owner = cjson.decode(owner)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if owner.expiry <= now or (row.expiry and row.expiry <= now) then
  return {'dead'}
end
return {'forward', row.sessionId, row.epoch or '', owner.advertiseUrl, owner.secret}
