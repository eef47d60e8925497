-- GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
-- Holds the requests of a deployment whose only server a rollout restarts, instead of answering 503 "no server".
--
-- The rollout (onprem.vllm.gateway_server, hold=<seconds>) puts a backend on hold over the admin socket before it
-- drains the backend's last server in rotation, and releases it once the new server is back UP:
--   onprem hold <backend> <seconds>   hold the backend's requests while none of its servers is UP, at most that long
--   onprem release <backend>          end the hold; prints what it held, as JSON
--   onprem holds                      every hold, as JSON
-- A held request waits in the gateway (its body already read), then goes to the first server that is UP again. A
-- request that waited past the hold's end gets the usual JSON 503 with Retry-After. A backend not on hold is never
-- held: a GPU fault or a crash takes a server out at once. Holds live in the running HAProxy only: a reload or
-- restart of the gateway ends them (the rollout's next drain sets them again).
local holds = {}

local POLL_MS = 100

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec // 1000
end

-- As onprem.vllm's haproxy_runtime.is_serving: UP (not "UP 1/2", on its way down) or without checks.
local function serving(backend)
  for _, server in pairs(backend.servers) do
    local status = server:get_stats()["status"]
    if status == "UP" or status == "no check" then
      return true
    end
  end
  return false
end

-- The longest wait counts the requests still waiting too: a release may come before they wake.
local function as_json(name, hold)
  local now, longest, waiting = now_ms(), hold.longest_ms, 0
  for _, started in pairs(hold.waiting) do
    longest = math.max(longest, now - started)
    waiting = waiting + 1
  end
  return string.format('{"backend":"%s","remaining_ms":%d,"waiting":%d,"held":%d,"longest_ms":%d}', name,
    math.max(0, hold.until_ms - now), waiting, hold.held, longest)
end

core.register_action("onprem_hold", { "http-req" }, function(txn)
  local name = txn:get_var("txn.backend")
  local hold = name and holds[name]
  if hold == nil then
    return
  end
  local backend = core.backends[name]
  local started = now_ms()
  if backend == nil or started >= hold.until_ms or serving(backend) then
    return
  end
  hold.held = hold.held + 1
  local ticket = hold.held
  hold.waiting[ticket] = started
  while holds[name] == hold and now_ms() < hold.until_ms and not serving(backend) do
    core.msleep(POLL_MS)
  end
  hold.waiting[ticket] = nil
  local waited = now_ms() - started
  if waited > hold.longest_ms then
    hold.longest_ms = waited
  end
  txn:set_var("txn.held_ms", waited)
end, 0)

-- The admin socket passes the command's words too: ("onprem", "hold", backend, seconds).
core.register_cli({ "onprem", "hold" }, "onprem hold <backend> <seconds> : hold its requests while no server is UP",
  function(applet, _, _, name, seconds)
    local limit = tonumber(seconds or "")
    if name == nil or core.backends[name] == nil or limit == nil or limit <= 0 then
      applet:send("onprem hold: no such backend, or seconds is not a positive number\n")
      return
    end
    local hold = holds[name]
    if hold == nil then
      hold = { waiting = {}, held = 0, longest_ms = 0, until_ms = 0 }
      holds[name] = hold
    end
    hold.until_ms = math.max(hold.until_ms, now_ms() + math.floor(limit * 1000))
    applet:send(as_json(name, hold) .. "\n")
  end)

core.register_cli({ "onprem", "release" }, "onprem release <backend> : end its hold, print what it held",
  function(applet, _, _, name)
    local hold = name and holds[name]
    holds[name or ""] = nil
    if hold == nil then
      applet:send('{"backend":"' .. tostring(name) .. '","not_held":true}\n')
      return
    end
    applet:send(as_json(name, hold) .. "\n")
  end)

core.register_cli({ "onprem", "holds" }, "onprem holds : every hold, as JSON", function(applet)
  local lines = {}
  for name, hold in pairs(holds) do
    lines[#lines + 1] = as_json(name, hold)
  end
  applet:send("[" .. table.concat(lines, ",") .. "]\n")
end)
