-- wrk script: every request is a NEW Azure DevOps service-hook event for the trigger-gateway.
--
--   wrk -t2 -c32 -d10s --latency -s bench/wrk_webhook.lua http://127.0.0.1:PORT/hooks/ado-pr-review \
--       -- [payload.json] [user:password] [id-prefix] [responses-per-thread done-file-prefix [exact]]
--
-- Defaults: examples/azure-devops/git.pullrequest.created.json (relative to the working directory),
-- azure:change-me (the dev triggers file), a random prefix. The body is the payload file as it is
-- (a UTF-8 BOM removed) with its top-level "id" replaced by "<prefix>-<thread>-<counter>", unique per
-- request, so the gateway never answers "200 duplicate". Requests carry Basic auth.
-- With responses-per-thread, each thread stops once it has that many responses (before -d ends): a fixed
-- amount of work, so a server's CPU time over the run can be divided by a count that does not depend on
-- its speed. Requests still in flight then are abandoned by wrk but still served: "sent" counts them.
-- A stopped thread creates <done-file-prefix><thread number>: wrk itself waits for -d to end (or SIGINT),
-- so whoever runs it interrupts it once every thread's file exists.
-- With a sixth argument "exact" a thread also SENDS no more than responses-per-thread requests: once it has
-- sent them, its connections get an empty request (nothing is written; they wait for the thread to stop), so
-- exactly threads x responses-per-thread requests reach the server and every one is answered before the thread
-- stops (bench/pipeline.py: a fixed number of webhooks, each a run to follow on the bus).
--
-- response() counts the HTTP statuses per thread; done() prints one line that bench/gateway.py parses:
--   webhook-bench {"requests":..., "sent":..., "duration_us":..., "latency_us":{...}, "errors":{...}, "statuses":{...}}
-- (defining response() makes wrk parse every response; the cost is the same for every server measured.)

local DEFAULT_PAYLOAD = "examples/azure-devops/git.pullrequest.created.json"
local DEFAULT_CREDENTIALS = "azure:change-me"

-- ---------------------------------------------------------------------------------------- helpers
local function base64(s)
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local chars = {}
    for k = 3, 0, -1 do
      local v = math.floor(n / 64 ^ k) % 64
      chars[#chars + 1] = alphabet:sub(v + 1, v + 1)
    end
    if not b then
      chars[3], chars[4] = "=", "="
    elseif not c then
      chars[4] = "="
    end
    out[#out + 1] = table.concat(chars)
  end
  return table.concat(out)
end

local function random_hex(bytes)
  local f = io.open("/dev/urandom", "rb")
  if f then
    local raw = f:read(bytes)
    f:close()
    return (raw:gsub(".", function(ch) return string.format("%02x", ch:byte()) end))
  end
  math.randomseed(os.time())
  local parts = {}
  for i = 1, bytes do parts[i] = string.format("%02x", math.random(0, 255)) end
  return table.concat(parts)
end

-- Index of the closing quote of the JSON string whose opening quote is at i.
local function string_end(text, i)
  local j = i + 1
  while true do
    local k = text:find('["\\]', j)
    if not k then error("unterminated JSON string at byte " .. i) end
    if text:sub(k, k) == "\\" then j = k + 2 else return k end
  end
end

-- Splits the JSON object text around the value of its top-level "id" (a string): before, after.
local function split_top_level_id(text)
  local depth, i, n = 0, 1, #text
  while i <= n do
    local c = text:sub(i, i)
    if c == '"' then
      local j = string_end(text, i)
      if depth == 1 and text:sub(i, j) == '"id"' then
        local value = text:match("^%s*:%s*()", j + 1)
        if value and text:sub(value, value) == '"' then
          return text:sub(1, value), text:sub(string_end(text, value))
        end
      end
      i = j + 1
    else
      if c == "{" or c == "[" then
        depth = depth + 1
      elseif c == "}" or c == "]" then
        depth = depth - 1
      end
      i = i + 1
    end
  end
  error("the payload has no top-level string \"id\"")
end

-- ---------------------------------------------------------------------------------------- main state
local threads = {}

function setup(thread)
  thread:set("thread_number", #threads + 1)
  threads[#threads + 1] = thread
end

-- ---------------------------------------------------------------------------------------- thread state
local before, after, prefix
local headers = {}
local limit, done_file, exact = nil, nil, false
counter = 0 -- requests sent by this thread (global: done() reads it through thread:get)
local answered = 0
statuses = {}

function init(args)
  local path = args[1] or DEFAULT_PAYLOAD
  local f = assert(io.open(path, "rb"), "cannot read the payload " .. path)
  local text = f:read("*a")
  f:close()
  if text:sub(1, 3) == "\239\187\191" then text = text:sub(4) end
  before, after = split_top_level_id(text)
  prefix = (args[3] or random_hex(6)) .. "-" .. thread_number
  headers["Content-Type"] = "application/json"
  headers["Authorization"] = "Basic " .. base64(args[2] or DEFAULT_CREDENTIALS)
  if args[4] then limit = tonumber(args[4]) end
  if args[5] then done_file = args[5] .. thread_number end
  exact = args[6] == "exact"
end

-- wrk calls request() once on the first thread's state before that thread runs (script_verify_request, to count
-- pipelined requests): that request is never sent, so it is not counted (nor given a counter's id).
local probed = false

function request()
  if thread_number == 1 and not probed then
    probed = true
    return wrk.format("POST", nil, headers, before .. prefix .. "-probe" .. after)
  end
  if exact and counter >= limit then return "" end -- wrk writes nothing: the connection idles until the stop
  counter = counter + 1
  return wrk.format("POST", nil, headers, before .. prefix .. "-" .. counter .. after)
end

function response(status, _, _)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
  answered = answered + 1
  if limit and answered == limit then
    wrk.thread:stop()
    if done_file then assert(io.open(done_file, "w")):close() end
  end
end

-- ---------------------------------------------------------------------------------------- summary
function done(summary, latency, _)
  local total = {}
  local sent = 0
  for _, thread in ipairs(threads) do
    sent = sent + (thread:get("counter") or 0)
    for status, count in pairs(thread:get("statuses") or {}) do
      total[status] = (total[status] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(total) do parts[#parts + 1] = string.format('"%s":%d', status, count) end
  table.sort(parts)
  local e = summary.errors
  io.write(string.format(
    'webhook-bench {"requests":%d,"sent":%d,"duration_us":%d,"bytes":%d,'
      .. '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f},'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},"statuses":{%s}}\n',
    summary.requests, sent, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout, table.concat(parts, ",")
  ))
end
