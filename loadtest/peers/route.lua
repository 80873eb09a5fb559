-- The nginx + Lua + Redis peer: Redis-backed sticky routing with lua-nginx-module, written
-- the lean way an expert would deploy it, so that Pinboard is measured against the best
-- version of this design rather than a naive one. Per request (access phase):
--
--   1. the id's bucket: sha256(id) through OpenSSL's low-level SHA256_* (one reused context,
--      no EVP fetch), first 4 bytes big-endian mod shards, as Pinboard computes it;
--   2. exactly one EVALSHA of resolve.lua, over a cosocket taken from the per-worker
--      keep-alive pool (setkeepalive with no idle timer). The command is sent as a reused
--      table of precomputed pieces (the EVALSHA head with the script's SHA, the three bucket
--      keys per namespace and bucket, the id's length prefix): no per-request string building.
--      The reply is one RESP status line "+{session} {epoch}" (no array to parse). NOSCRIPT
--      (a flushed script cache) loads the script with SCRIPT LOAD and retries once. The
--      placement is never cached: every request asks Redis, as Pinboard does;
--   3. the owner's URL and secret, kept per worker process and session (a session's URL and
--      secret never change): the first request to meet a session reads its copy with one
--      HGET, as Pinboard's Store::worker_of does once per session and core. The entry also
--      holds the HMAC key schedule (the inner and outer SHA256 states after the padded key),
--      computed once per secret, as Pinboard's Signer does;
--   4. Pinboard-Attestation: the token Pinboard signs (src/attestation.rs): header
--      {"alg":"HS256","typ":"pinboard+jwt"}, claims
--      {"aud":session,"iat":now,"exp":now+30,"purpose":"forward","inst":"/{ns}/{id}","epoch":epoch},
--      HS256 under the owner's secret. Pinboard stamps iat in whole seconds, so within one
--      second the token of a given (session, instance, epoch) is the same bytes: it is signed
--      once per (session, instance, epoch, second) and kept in a per-worker table that is
--      dropped when the second changes (bounded by one second's ids). The token is written
--      straight into one C buffer (header, base64url claims, ".", base64url MAC): one Lua
--      string per signature besides the claims;
--   5. proxy_pass through a balancer_by_lua upstream (keep-alive connections to the owner),
--      with Pinboard-Epoch and Pinboard-Attestation set from nginx variables.
--
-- RESP is spoken here by hand: Debian has no lua-resty-redis, and the one command needs none.
local ffi = require "ffi"
local balancer = require "ngx.balancer"
require "ngx.base64"   -- declares ngx_str_t and ngx_encode_base64url for the FFI

local C = ffi.C
local ffi_copy, ffi_string, ffi_new = ffi.copy, ffi.string, ffi.new
local byte, find, sub, char = string.byte, string.find, string.sub, string.char
local ngx_var, ngx_time, ngx_exit, ngx_null = ngx.var, ngx.time, ngx.exit, ngx.null
local tcp = ngx.socket.tcp
local log, ERR = ngx.log, ngx.ERR
local bit = require "bit"
local bxor = bit.bxor

ffi.cdef [[
typedef struct {
  unsigned int h[8];
  unsigned int Nl, Nh;
  unsigned int data[16];
  unsigned int num, md_len;
} pinboard_sha256_ctx;
int SHA256_Init(pinboard_sha256_ctx *c);
int SHA256_Update(pinboard_sha256_ctx *c, const void *data, size_t len);
int SHA256_Final(unsigned char *md, pinboard_sha256_ctx *c);
]]
-- nginx links libcrypto: its symbols are in the process already.
local crypto = C
if not pcall(function() return crypto.SHA256_Init end) then
  crypto = ffi.load("libcrypto.so.3")
end
local CTX_SIZE = ffi.sizeof("pinboard_sha256_ctx")

local _M = {}
local cfg = {
  redis_host = "127.0.0.1", redis_port = 6379, prefix = "pinboard:", shards = 16,
  env = "default", pool_size = 256,
}

local script            -- resolve.lua's text, for SCRIPT LOAD on NOSCRIPT
local evalsha_head      -- "*7\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n3\r\n"
local script_load       -- SCRIPT LOAD, encoded once
local bucket_prefix = {} -- bucket -> "{prefix}{b}:"

local function bulk(s)
  return "$" .. #s .. "\r\n" .. s .. "\r\n"
end

local function to_hex(bin)
  return (bin:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- opts: redis_host, redis_port, prefix, shards, env, script_path (the Redis-side resolve.lua).
function _M.configure(opts)
  for k, v in pairs(opts) do
    cfg[k] = v
  end
  local f = assert(io.open(cfg.script_path, "rb"))
  script = f:read("*a")
  f:close()
  -- The SHA Redis knows the script by.
  local sha = to_hex(ngx.sha1_bin(script))
  evalsha_head = "*7\r\n" .. bulk("EVALSHA") .. bulk(sha) .. bulk("3")
  script_load = "*3\r\n" .. bulk("SCRIPT") .. bulk("LOAD") .. bulk(script)
  for b = 0, cfg.shards - 1 do
    bucket_prefix[b] = cfg.prefix .. "{" .. b .. "}:"
  end
end

-- "$n\r\n" for every id length the location's regex admits.
local len_prefix = {}
for n = 1, 256 do
  len_prefix[n] = "$" .. n .. "\r\n"
end

-- The three KEYS of resolve.lua, bulk-encoded, per namespace and bucket. Namespaces come from
-- the URL: a bounded number are kept, any further one is encoded per request.
local keys_of, namespaces, MAX_NAMESPACES = {}, 0, 64
local function encode_keys(ns, b)
  local p = bucket_prefix[b]
  return bulk(p .. cfg.env .. ":/" .. ns .. ":placements") .. bulk(p .. "alive")
    .. bulk(p .. "workers")
end
local function keys_for(ns, b)
  local per = keys_of[ns]
  if per then
    return per[b]
  end
  if namespaces >= MAX_NAMESPACES then
    return encode_keys(ns, b)
  end
  per = {}
  for i = 0, cfg.shards - 1 do
    per[i] = encode_keys(ns, i)
  end
  keys_of[ns], namespaces = per, namespaces + 1
  return per[b]
end

local bucket_ctx = ffi_new("pinboard_sha256_ctx")
local digest = ffi_new("unsigned char[32]")
local function bucket_of(id)
  crypto.SHA256_Init(bucket_ctx)
  crypto.SHA256_Update(bucket_ctx, id, #id)
  crypto.SHA256_Final(digest, bucket_ctx)
  return (((digest[0] * 256 + digest[1]) * 256 + digest[2]) * 256 + digest[3]) % cfg.shards
end

-- The HMAC-SHA256 key schedule of one secret: the SHA256 states after the inner and the
-- outer padded key, copied per signature.
local function keyed(secret)
  if #secret > 64 then
    crypto.SHA256_Init(bucket_ctx)
    crypto.SHA256_Update(bucket_ctx, secret, #secret)
    crypto.SHA256_Final(digest, bucket_ctx)
    secret = ffi_string(digest, 32)
  end
  local ipad, opad = {}, {}
  for i = 1, 64 do
    local k = byte(secret, i) or 0
    ipad[i], opad[i] = char(bxor(k, 0x36)), char(bxor(k, 0x5c))
  end
  local inner, outer = ffi_new("pinboard_sha256_ctx"), ffi_new("pinboard_sha256_ctx")
  crypto.SHA256_Init(inner)
  crypto.SHA256_Update(inner, table.concat(ipad), 64)
  crypto.SHA256_Init(outer)
  crypto.SHA256_Update(outer, table.concat(opad), 64)
  return inner, outer
end

-- base64url({"alg":"HS256","typ":"pinboard+jwt"}) and the dot after it.
local HEADER = "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9."
local HLEN = #HEADER
local TOKEN_TTL = 30   -- src/attestation.rs TOKEN_TTL_SECS
local token_size = 2048
local token_buf = ffi_new("unsigned char[?]", token_size)
ffi_copy(token_buf, HEADER, HLEN)
local work = ffi_new("pinboard_sha256_ctx")
local mac = ffi_new("unsigned char[32]")
local src, dst = ffi_new("ngx_str_t[1]"), ffi_new("ngx_str_t[1]")

local function sign(owner, claims)
  local need = HLEN + math.ceil(#claims / 3) * 4 + 1 + 44
  if need > token_size then
    token_size = need
    token_buf = ffi_new("unsigned char[?]", token_size)
    ffi_copy(token_buf, HEADER, HLEN)
  end
  local s, d = src[0], dst[0]
  s.data, s.len = claims, #claims
  d.data = token_buf + HLEN
  C.ngx_encode_base64url(dst, src)
  local n = HLEN + tonumber(d.len)
  ffi_copy(work, owner.inner, CTX_SIZE)
  crypto.SHA256_Update(work, token_buf, n)
  crypto.SHA256_Final(mac, work)
  ffi_copy(work, owner.outer, CTX_SIZE)
  crypto.SHA256_Update(work, mac, 32)
  crypto.SHA256_Final(mac, work)
  token_buf[n] = 46   -- "."
  s.data, s.len = mac, 32
  d.data = token_buf + n + 1
  C.ngx_encode_base64url(dst, src)
  return ffi_string(token_buf, n + 1 + tonumber(d.len))
end

-- Tokens of the current second: ns -> id -> {session, epoch, token}.
local tokens_sec, tokens = -1, {}

local function attestation(owner, sid, ns, id, epoch)
  local now = ngx_time()
  if now ~= tokens_sec then
    tokens_sec, tokens = now, {}
  end
  local per = tokens[ns]
  if not per then
    per = {}
    tokens[ns] = per
  end
  local e = per[id]
  if e and e[1] == sid and e[2] == epoch then
    return e[3]
  end
  local token = sign(owner, owner.aud .. now .. ',"exp":' .. (now + TOKEN_TTL)
    .. ',"purpose":"forward","inst":"/' .. ns .. "/" .. id .. '","epoch":"' .. epoch .. '"}')
  if e then
    e[1], e[2], e[3] = sid, epoch, token
  else
    per[id] = { sid, epoch, token }
  end
  return token
end

-- Owners met so far: session -> {host, port, inner, outer, aud}. A session's URL and secret
-- never change; an owner that goes away is met as 'dead' in Redis first.
local owners = {}

-- One RESP bulk string reply (HGET), or nil.
local function read_bulk(sock)
  local line, err = sock:receive()
  if not line then
    return nil, err
  end
  if byte(line, 1) ~= 36 then   -- "$"
    return nil, line
  end
  local n = tonumber(sub(line, 2))
  if n < 0 then
    return ngx_null
  end
  local data, e = sock:receive(n + 2)
  if not data then
    return nil, e
  end
  return sub(data, 1, n)
end

local function learn(sock, sid, b)
  local key = bucket_prefix[b] .. "workers"
  local ok, err = sock:send("*3\r\n$4\r\nHGET\r\n" .. bulk(key) .. bulk(sid))
  if not ok then
    return nil, err
  end
  local copy, rerr = read_bulk(sock)
  if not copy then
    return nil, rerr
  end
  if copy == ngx_null then
    return false
  end
  -- Two string members of the copy's JSON (Debian's nginx Lua has no cjson): a URL and a hex
  -- secret, neither of which JSON escapes.
  local url, secret = copy:match('"advertiseUrl":"([^"\\]*)"'), copy:match('"secret":"([^"\\]*)"')
  if not url or not secret then
    return false
  end
  local host, port = url:match("^http://([^:/]+):(%d+)")
  if not host then
    host, port = url:match("^http://([^:/]+)"), 80
  end
  local inner, outer = keyed(secret)
  local owner = {
    host = host, port = tonumber(port), inner = inner, outer = outer,
    aud = '{"aud":"' .. sid .. '","iat":',
  }
  owners[sid] = owner
  return owner
end

local request = {}   -- the EVALSHA command's pieces, refilled per request (send copies them)

local function fail(sock, what, err)
  sock:close()
  log(ERR, what, err)
  return ngx_exit(502)
end

-- access phase: resolve $ns/$id in Redis, or answer.
function _M.resolve()
  local ns, id = ngx_var.ns, ngx_var.id
  local b = bucket_of(id)
  local sock = tcp()
  local ok, err = sock:connect(cfg.redis_host, cfg.redis_port)
  if not ok then
    log(ERR, "redis connect: ", err)
    return ngx_exit(502)
  end
  request[1], request[2], request[3], request[4], request[5] =
    evalsha_head, keys_for(ns, b), len_prefix[#id], id, "\r\n"
  local line
  for _ = 1, 2 do
    ok, err = sock:send(request)
    if not ok then
      return fail(sock, "redis send: ", err)
    end
    line, err = sock:receive()
    if not line then
      return fail(sock, "redis receive: ", err)
    end
    if byte(line, 1) ~= 45 or not find(line, "^%-NOSCRIPT") then   -- "-"
      break
    end
    -- A flushed script cache: load the script again, then the one EVALSHA once more.
    local sha
    ok, err = sock:send(script_load)
    if ok then
      sha, err = read_bulk(sock)
    end
    if not ok or not sha or sha == ngx_null then
      return fail(sock, "redis script load: ", err)
    end
  end
  if byte(line, 1) ~= 43 then   -- "+"
    return fail(sock, "redis: ", line)
  end
  if byte(line, 2) == 45 then   -- "+-miss" / "+-dead": no live owner; this peer places nothing
    sock:setkeepalive(0, cfg.pool_size)
    ngx.header["Retry-After"] = "1"
    return ngx_exit(503)
  end
  local space = find(line, " ", 3, true)
  local sid, epoch = sub(line, 2, space - 1), sub(line, space + 1)
  local owner = owners[sid]
  if not owner then
    owner, err = learn(sock, sid, b)
    if owner == nil then
      return fail(sock, "redis worker copy: ", err)
    end
    if not owner then
      sock:setkeepalive(0, cfg.pool_size)
      return ngx_exit(502)
    end
  end
  sock:setkeepalive(0, cfg.pool_size)
  ngx.ctx.owner = owner
  ngx_var.pb_epoch = epoch
  ngx_var.pb_attestation = attestation(owner, sid, ns, id, epoch)
end

-- balancer phase: the owner resolved above; its keep-alive connections are nginx's.
function _M.balance()
  local owner = ngx.ctx.owner
  local ok, err = balancer.set_current_peer(owner.host, owner.port)
  if not ok then
    log(ERR, "set_current_peer: ", err)
    return ngx_exit(500)
  end
end

return _M
