-- wrk: a mixed load without WebSockets. Per request, by weight:
--   70%  GET  {NS}/{PREFIX}{n}/count  on one of IDS placed ids (steady state)
--   20%  POST {NS}/{PREFIX}{n}/echo   with a body of 64 B, 1 KiB or 16 KiB (same ids)
--   10%  GET  {NS}/{FRESH}{RUN}-{thread}-{k}/count  on a new id (placement)
--
--   wrk -t2 -c64 -d30s -s loadtest/wrk/mixed.lua http://127.0.0.1:8080
--
-- Environment (all optional): NS=/threads  PREFIX=s-  IDS=10000  FRESH=m-  RUN
--   TOKEN  sent as `Authorization: Bearer TOKEN` (a data-plane passport)
--   MIX    weights "get,post,fresh" (default 70,20,10)
-- The URL's path is the deployment's base path. Prints one `BENCH …` line at the end.

local ns = os.getenv("NS") or "/threads"
local prefix = os.getenv("PREFIX") or "s-"
local count = tonumber(os.getenv("IDS") or "10000")
local fresh = os.getenv("FRESH") or "m-"
math.randomseed(os.time())
local run = os.getenv("RUN") or (os.time() .. "x" .. math.random(1, 1e9))
local w = {}
for x in (os.getenv("MIX") or "70,20,10"):gmatch("%d+") do
  w[#w + 1] = tonumber(x)
end
local total = w[1] + w[2] + w[3]

local nthreads = 0
function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

local gets, posts, fresh_head, fresh_tail, seq
function init(args)
  tid = tid or 0
  math.randomseed(os.time() * 1000 + tid * 7919)
  local p = (wrk.path or "/"):gsub("%?.*$", ""):gsub("/+$", "")
  local function headers(extra)
    local h = { Host = wrk.host }
    local token = os.getenv("TOKEN")
    if token and token ~= "" then
      h["Authorization"] = "Bearer " .. token
    end
    for k, v in pairs(extra or {}) do
      h[k] = v
    end
    return h
  end
  local bodies = { string.rep("a", 64), string.rep("b", 1024), string.rep("c", 16384) }
  gets, posts = {}, {}
  for i = 1, count do
    local path = p .. ns .. "/" .. prefix .. (i - 1)
    gets[i] = wrk.format("GET", path .. "/count", headers())
    local body = bodies[(i % 3) + 1]
    posts[i] = wrk.format("POST", path .. "/echo",
      headers({ ["Content-Type"] = "application/octet-stream" }), body)
  end
  local h = {}
  for k, v in pairs(headers()) do
    h[#h + 1] = k .. ": " .. v .. "\r\n"
  end
  fresh_head = "GET " .. p .. ns .. "/" .. fresh .. run .. "-" .. tid .. "-"
  fresh_tail = "/count HTTP/1.1\r\n" .. table.concat(h) .. "\r\n"
  seq = 0
end

function request()
  local r = math.random(total)
  if r <= w[1] then
    return gets[math.random(count)]
  elseif r <= w[1] + w[2] then
    return posts[math.random(count)]
  end
  seq = seq + 1
  return fresh_head .. seq .. fresh_tail
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d p999_us=%d max_us=%d "
      .. "connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
