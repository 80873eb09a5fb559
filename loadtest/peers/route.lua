-- The nginx + Lua + Redis peer: Redis-backed sticky routing as people build it with
-- lua-nginx-module. Per request: the id's bucket (sha256, as Pinboard computes it), one
-- EVALSHA of resolve.lua over a keep-alive cosocket to Redis (RESP spoken here: Debian has no
-- lua-resty-redis), then proxy_pass to the owner through a balancer_by_lua upstream with
-- keep-alive connections. The forward carries Pinboard-Epoch from the placement row and a
-- Pinboard-Attestation signed with the owner's secret (HMAC-SHA256 through OpenSSL via FFI,
-- one per request: it is bound to the instance and epoch), so the worker sees exactly what
-- Pinboard would send it.
local ffi = require "ffi"
local balancer = require "ngx.balancer"

ffi.cdef [[
unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);
const void *EVP_sha256(void);
unsigned char *HMAC(const void *evp_md, const void *key, int key_len,
                    const unsigned char *d, size_t n, unsigned char *md, unsigned int *md_len);
]]
-- nginx links libcrypto: its symbols are in the process already.
local crypto = ffi.C
if not pcall(function() return crypto.SHA256 end) then
  crypto = ffi.load("libcrypto.so.3")
end

local _M = {}
local cfg = {
  redis_host = "127.0.0.1", redis_port = 6379, prefix = "pinboard:", shards = 16,
  env = "default", sha = nil, script = nil, pool_size = 128,
}

-- opts: redis_host, redis_port, prefix, shards, env, script_path (the Redis-side resolve.lua).
function _M.configure(opts)
  for k, v in pairs(opts) do
    cfg[k] = v
  end
  local f = assert(io.open(cfg.script_path, "rb"))
  cfg.script = f:read("*a")
  f:close()
  -- The SHA Redis knows the script by; a NOSCRIPT reply loads it again (SCRIPT LOAD).
  cfg.sha = _M.to_hex(ngx.sha1_bin(cfg.script))
end

local digest = ffi.new("unsigned char[32]")
local maclen = ffi.new("unsigned int[1]")

function _M.to_hex(bin)
  return (bin:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function bucket_of(id)
  crypto.SHA256(id, #id, digest)
  local n = ((digest[0] * 256 + digest[1]) * 256 + digest[2]) * 256 + digest[3]
  return n % cfg.shards
end

local function b64url(s)
  return (ngx.encode_base64(s, true):gsub("[+/]", { ["+"] = "-", ["/"] = "_" }))
end

-- base64url({"alg":"HS256","typ":"pinboard+jwt"}) and the dot after it.
local HEADER = "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9."
-- Signed per request, as Pinboard does: the token is bound to the instance and the epoch
-- (contract §11), so no two requests for different ids could share one.
local function attestation(session, secret, inst, epoch)
  local now = ngx.time()
  local signing = HEADER .. b64url(string.format(
    '{"aud":"%s","iat":%d,"exp":%d,"purpose":"forward","inst":"%s","epoch":"%s"}',
    session, now, now + 30, inst, epoch))
  crypto.HMAC(crypto.EVP_sha256(), secret, #secret, signing, #signing, digest, maclen)
  return signing .. "." .. b64url(ffi.string(digest, maclen[0]))
end

local function bulk(s)
  return "$" .. #s .. "\r\n" .. s .. "\r\n"
end

-- One RESP reply: strings, integers, nil, arrays of those; errors as nil, message.
local function read_reply(sock)
  local line, err = sock:receive("*l")
  if not line then
    return nil, err
  end
  local kind, rest = line:sub(1, 1), line:sub(2)
  if kind == "$" then
    local n = tonumber(rest)
    if n < 0 then
      return ngx.null
    end
    local data, e = sock:receive(n + 2)
    if not data then
      return nil, e
    end
    return data:sub(1, n)
  elseif kind == "*" then
    local n = tonumber(rest)
    if n < 0 then
      return ngx.null
    end
    local out = {}
    for i = 1, n do
      local v, e = read_reply(sock)
      if v == nil then
        return nil, e
      end
      out[i] = v
    end
    return out
  elseif kind == ":" then
    return tonumber(rest)
  elseif kind == "+" then
    return rest
  elseif kind == "-" then
    return nil, rest
  end
  return nil, "bad reply: " .. line
end

local function command(sock, ...)
  local args = { ... }
  local parts = { "*" .. #args .. "\r\n" }
  for i = 1, #args do
    parts[#parts + 1] = bulk(args[i])
  end
  local ok, err = sock:send(parts)
  if not ok then
    return nil, err
  end
  return read_reply(sock)
end

local function evalsha(sock, key, env, ns, id)
  if not cfg.sha then
    local sha, err = command(sock, "SCRIPT", "LOAD", cfg.script)
    if not sha then
      return nil, err
    end
    cfg.sha = sha
  end
  local reply, err = command(sock, "EVALSHA", cfg.sha, "1", key, env, ns, id)
  if not reply and err and err:find("^NOSCRIPT") then
    cfg.sha = nil
    return evalsha(sock, key, env, ns, id)
  end
  return reply, err
end

local peers = {}   -- advertiseUrl -> {host, port}

local function peer_of(url)
  local p = peers[url]
  if not p then
    local host, port = url:match("^http://([^:/]+):(%d+)")
    if not host then
      host, port = url:match("^http://([^:/]+)"), 80
    end
    p = { host, tonumber(port) }
    peers[url] = p
  end
  return p
end

-- access phase: resolve $ns/$id in Redis, or answer.
function _M.resolve()
  local ns, id = "/" .. ngx.var.ns, ngx.var.id
  local key = cfg.prefix .. "{" .. bucket_of(id) .. "}:"
  local sock = ngx.socket.tcp()
  sock:settimeouts(1000, 1000, 1000)
  local ok, err = sock:connect(cfg.redis_host, cfg.redis_port)
  if not ok then
    ngx.log(ngx.ERR, "redis connect: ", err)
    return ngx.exit(502)
  end
  local reply, rerr = evalsha(sock, key, cfg.env, ns, id)
  if not reply then
    sock:close()
    ngx.log(ngx.ERR, "redis: ", rerr)
    return ngx.exit(502)
  end
  sock:setkeepalive(60000, cfg.pool_size)
  if reply[1] ~= "forward" then
    ngx.header["Retry-After"] = "1"
    return ngx.exit(503)
  end
  local session, epoch, url, secret = reply[2], reply[3], reply[4], reply[5]
  ngx.ctx.peer = peer_of(url)
  ngx.var.pb_epoch = epoch
  ngx.var.pb_attestation = attestation(session, secret, ns .. "/" .. id, epoch)
end

-- balancer phase: the owner resolved above; its keep-alive connections are nginx's.
function _M.balance()
  local p = ngx.ctx.peer
  local ok, err = balancer.set_current_peer(p[1], p[2])
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

return _M
