-- wrk: steady state. GET {base}{NS}/{PREFIX}{n}{SUFFIX} over IDS ids already placed, chosen at
-- random per request (or in order with SEQ=1, to place them all once before measuring).
--
--   wrk -t2 -c64 -d10s -s loadtest/wrk/steady.lua http://127.0.0.1:8080
--
-- Environment (all optional):
--   NS=/threads  PREFIX=s-  IDS=10000  SUFFIX=/count  SEQ=0
--   TOKEN        sent as `Authorization: Bearer TOKEN` (a data-plane passport)
--   EPOCH        sent as Pinboard-Epoch, with ATTESTATIONS (a file, line i the
--                Pinboard-Attestation of id i-1, bound to it and EPOCH as contract §11 says):
--                only to talk to a worker directly (or through a plain proxy), as Pinboard would
-- The URL's path is the deployment's base path (http://host:8080/edge → /edge/threads/...).
-- At the end it prints one line `BENCH requests=… rps=… p50_us=… p99_us=… p999_us=… …`.

local ns = os.getenv("NS") or "/threads"
local prefix = os.getenv("PREFIX") or "s-"
local count = tonumber(os.getenv("IDS") or "10000")
local suffix = os.getenv("SUFFIX") or "/count"
local seq = os.getenv("SEQ") == "1"

local nthreads = 0
function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

local function base()
  local p = wrk.path or "/"
  p = p:gsub("%?.*$", ""):gsub("/+$", "")
  return p
end

local function headers()
  local h = {}
  local token = os.getenv("TOKEN")
  if token and token ~= "" then
    h["Authorization"] = "Bearer " .. token
  end
  local epoch = os.getenv("EPOCH")
  if epoch and epoch ~= "" then
    h["Pinboard-Epoch"] = epoch
  end
  return h
end

-- Line i of the ATTESTATIONS file: the token for id i-1.
local function attestations()
  local file = os.getenv("ATTESTATIONS")
  if not file or file == "" then
    return nil
  end
  local tokens = {}
  for line in io.lines(file) do
    tokens[#tokens + 1] = line
  end
  return tokens
end

local reqs, n, next_i
function init(args)
  tid = tid or 0
  math.randomseed(os.time() * 1000 + tid * 7919)
  local h, b, tokens = headers(), base(), attestations()
  reqs, n = {}, count
  for i = 1, n do
    if tokens then
      h["Pinboard-Attestation"] = tokens[i]
    end
    reqs[i] = wrk.format("GET", b .. ns .. "/" .. prefix .. (i - 1) .. suffix, h)
  end
  -- In order, each thread from its own offset: every id is asked for within n requests.
  next_i = (tid * 7919) % n + 1
end

function request()
  if seq then
    local r = reqs[next_i]
    next_i = next_i % n + 1
    return r
  end
  return reqs[math.random(n)]
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
