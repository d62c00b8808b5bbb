-- wrk script: POST a batch of 10 operations, each request from one of 1000 clients,
-- and count the answers by status so refusals cannot pass for throughput.
local op = '{"operation":"buy","unit-cost":10.10,"quantity":100}'
local ops = {}
for i = 1, 10 do ops[i] = op end
local body = "[" .. table.concat(ops, ",") .. "]"
local counter = 0

-- With INTAKE_KEYS (a file of API keys, one a line), each request authenticates with the
-- next key (Authorization: Bearer) instead of naming its client with X-Client-Id.
local keys = {}
local keys_file = os.getenv("INTAKE_KEYS")
if keys_file then
  for line in io.lines(keys_file) do keys[#keys + 1] = line end
end

request = function()
  counter = counter + 1
  local headers = { ["Content-Type"] = "application/json" }
  if #keys > 0 then
    headers["Authorization"] = "Bearer " .. keys[counter % #keys + 1]
  else
    headers["X-Client-Id"] = "client-" .. (counter % 1000)
  end
  return wrk.format("POST", "/operations", headers, body)
end

local statuses = {}
response = function(status)
  statuses[status] = (statuses[status] or 0) + 1
end

done = function(summary, latency)
  io.write(string.format("p50 %.2f ms  p99 %.2f ms  requests %d  non-2xx-or-errors %d\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.requests,
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout))
end
