-- The load of scripts/benchmark_serving.py for wrk (Debian's package): POST /translate with one
-- raw sentence per request, the sentences of the file given after "--" taken in turn (each
-- thread from its own start), and at the end one line "vaswani-load: {JSON}" with every
-- response's status counted, wrk's socket errors by kind, and the latency percentiles. wrk
-- counts answers, not their text: the benchmark checks the texts with its own client.
--
--   wrk -t1 -c64 -d30s -s scripts/serving_load.lua http://127.0.0.1:8000 -- sentences.txt

local requests = {}
local next_index = 1
statuses = {}

local function json_string(text)
  local escaped = text:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end)
  return '"' .. escaped .. '"'
end

local threads = {}

function setup(thread)
  thread:set("thread_number", #threads)
  table.insert(threads, thread)
end

function init(args)
  local headers = {["Content-Type"] = "application/json"}
  for line in io.lines(args[1]) do
    if line:match("%S") then
      table.insert(requests, wrk.format("POST", "/translate", headers,
                                        '{"text":[' .. json_string(line) .. ']}'))
    end
  end
  next_index = (thread_number * 7919) % #requests + 1
end

function request()
  local text = requests[next_index]
  next_index = next_index % #requests + 1
  return text
end

function response(status, headers, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
end

function done(summary, latency, requests_per_thread)
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      counts[status] = (counts[status] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(counts) do
    table.insert(parts, string.format('"%s":%d', status, count))
  end
  local errors = summary.errors
  io.write(string.format(
    'vaswani-load: {"requests":%d,"duration_us":%d,"statuses":{%s},' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},' ..
    '"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, table.concat(parts, ","), errors.connect, errors.read,
    errors.write, errors.timeout, latency:percentile(50), latency:percentile(99)))
end
