-- wrk: the placement path. Every request names an id never seen before
-- ({PREFIX}{RUN}-{thread}-{n}), so each one is a new placement: GET {base}{NS}/{id}{SUFFIX}.
--
--   RUN=r1 wrk -t2 -c64 -d10s -s loadtest/wrk/fresh.lua http://127.0.0.1:8080
--
-- Environment (all optional): NS=/threads  PREFIX=f-  SUFFIX=/count
--   RUN    tag making ids unique across runs (default: the start time and a random number)
--   TOKEN  sent as `Authorization: Bearer TOKEN` (a data-plane passport)
-- The URL's path is the deployment's base path. Prints one `BENCH …` line at the end.
-- Every placed id stays placed (and held by its worker) until released or its worker goes.

local ns = os.getenv("NS") or "/threads"
local prefix = os.getenv("PREFIX") or "f-"
local suffix = os.getenv("SUFFIX") or "/count"
math.randomseed(os.time())
local run = os.getenv("RUN") or (os.time() .. "x" .. math.random(1, 1e9))

local nthreads = 0
function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

local head, tail, seq
function init(args)
  tid = tid or 0
  local p = (wrk.path or "/"):gsub("%?.*$", ""):gsub("/+$", "")
  local h = { Host = wrk.host }
  local token = os.getenv("TOKEN")
  if token and token ~= "" then
    h["Authorization"] = "Bearer " .. token
  end
  local lines = {}
  for k, v in pairs(h) do
    lines[#lines + 1] = k .. ": " .. v .. "\r\n"
  end
  head = "GET " .. p .. ns .. "/" .. prefix .. run .. "-" .. tid .. "-"
  tail = suffix .. " HTTP/1.1\r\n" .. table.concat(lines) .. "\r\n"
  seq = 0
end

function request()
  seq = seq + 1
  return head .. seq .. tail
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
