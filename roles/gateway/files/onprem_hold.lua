-- GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
-- Holds the requests of a deployment whose only server a rollout restarts, instead of answering 503 "no server".
--
-- The rollout (onprem.vllm.gateway_server, hold=<seconds>) puts a backend on hold over the admin socket before it
-- drains the backend's last server in rotation, and releases it once the new server is back UP:
--   onprem hold <backend> <seconds>   hold the backend's requests while none of its servers is UP, at most that long
--   onprem release <backend>          end the hold; prints what it held, as JSON
--   onprem holds                      every hold, as JSON
-- A held request waits in the gateway (its body already read), then goes to the first server that is UP again. A
-- request that waited past the hold's end gets the usual JSON 503 with Retry-After. Holds live in the running HAProxy
-- only: a reload or restart of the gateway ends them (the rollout's next drain sets them again).
--
-- A host's orderly shutdown (onprem-vllm-drain.service, a reboot) holds too, with no rollout to start it: a server its
-- gateway checks take out (DOWN, not the rollout's MAINT) is asked for its drain status (GET /onprem/drain, open on
-- the server's middleware: counts and names only). One that says it drains for a shutdown, not for a GPU fault, is
-- a planned restart: while no server of its backend is UP, the backend's requests wait, for at most the bound this
-- file is loaded with (lua-load's argument, gateway_hold_timeout) from the drain's start, through the reboot (a host
-- that answers nothing, or has booted and does not drain any more, keeps its mark) until a server is UP again. A GPU
-- fault, a crash or a server that never said it drains is never held: its requests get the JSON 503 at once.
local holds = {}
-- backend name -> server name -> the time (ms) its drain for a shutdown was first seen
local planned = {}
-- backend name -> when (ms) update_planned last finished asking a DOWN server of it its drain status
local polled_at = {}
local PLANNED_BOUND_MS = math.floor((tonumber((select(1, ...))) or 0) * 1000)
-- With mutual TLS to the servers (lua-load's second argument): haproxy.cfg's listen onprem-status, which reaches a
-- server with the gateway's client certificate, as this HTTP client cannot.
local STATUS_ADDRESS = select(2, ...)

local POLL_MS = 100
local STATUS_POLL_MS = 500
local STATUS_TIMEOUT_MS = 2000

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

-- What a server's middleware says of its drain: "shutdown" (draining, no GPU fault), "fault" (a GPU fault), "other"
-- (it answered anything else: not draining, or no drain status at all), nil (no answer: stopped, rebooting or
-- unreachable).
local function drain_status(backend_name, server_name, server)
  local response
  if STATUS_ADDRESS then
    response = core.httpclient():get{ url = "http://" .. STATUS_ADDRESS .. "/onprem/drain",
                                      headers = { ["X-Onprem-Status"] = { backend_name .. "/" .. server_name } },
                                      timeout = STATUS_TIMEOUT_MS }
  else
    response = core.httpclient():get{ url = "http://" .. server:get_addr() .. "/onprem/drain",
                                      timeout = STATUS_TIMEOUT_MS }
  end
  if response == nil or response.status == nil or response.status == 0 then
    return nil
  end
  local body = response.body or ""
  if response.status == 200 and body:find('"gpu_fault":%s*true') then
    return "fault"
  end
  if response.status == 200 and body:find('"draining":%s*true') and body:find('"gpu_fault":%s*false') then
    return "shutdown"
  end
  return "other"
end

-- Mark the servers of a backend that went DOWN for a planned shutdown; clear a mark once the server is UP or reports
-- a GPU fault. A marked server that answers nothing (the host is off) or no longer drains (it has booted, and the
-- gateway's checks have not brought it UP yet) keeps its mark: the hold lasts until a server is UP, within its bound.
local function update_planned(name, backend)
  local marks = planned[name] or {}
  for server_name, server in pairs(backend.servers) do
    local status = server:get_stats()["status"] or ""
    if status:sub(1, 4) == "DOWN" then
      local said = drain_status(name, server_name, server)
      polled_at[name] = now_ms()
      if said == "shutdown" then
        marks[server_name] = marks[server_name] or now_ms()
      elseif said == "fault" then
        marks[server_name] = nil
      end
    elseif status:sub(1, 2) == "UP" or status == "no check" then
      marks[server_name] = nil
    end
  end
  planned[name] = next(marks) and marks or nil
end

-- The end (ms) of the planned restart's hold of a backend: its earliest live mark's start + the bound; nil: none.
local function planned_until(name)
  local earliest
  for _, since in pairs(planned[name] or {}) do
    earliest = math.min(earliest or since, since)
  end
  return earliest and earliest + PLANNED_BOUND_MS or nil
end

if PLANNED_BOUND_MS > 0 then
  core.register_task(function()
    while true do
      for name, backend in pairs(core.backends) do
        -- "<...>": HAProxy's own proxies (its HTTP client's among them)
        if name:sub(1, 1) ~= "<" and (not serving(backend) or planned[name]) then
          update_planned(name, backend)
        end
      end
      core.msleep(STATUS_POLL_MS)
    end
  end)
end

local function wait(txn, hold, keep_waiting)
  local started = now_ms()
  hold.held = hold.held + 1
  local ticket = hold.held
  hold.waiting[ticket] = started
  while keep_waiting() do
    core.msleep(POLL_MS)
  end
  hold.waiting[ticket] = nil
  local waited = now_ms() - started
  if waited > hold.longest_ms then
    hold.longest_ms = waited
  end
  txn:set_var("txn.held_ms", waited)
end

-- The planned restarts' own counts, as `onprem holds` lists them (reason "shutdown").
local shutdown_holds = {}

core.register_action("onprem_hold", { "http-req" }, function(txn)
  local name = txn:get_var("txn.backend")
  local backend = name and core.backends[name]
  if backend == nil or serving(backend) then
    return
  end
  local hold = holds[name]
  if hold ~= nil and now_ms() < hold.until_ms then
    wait(txn, hold, function() return holds[name] == hold and now_ms() < hold.until_ms and not serving(backend) end)
    return
  end
  if PLANNED_BOUND_MS <= 0 then
    return
  end
  -- The task may not have seen the drain yet (it polls twice a second): ask now rather than refuse the request, unless
  -- a DOWN server was asked within that time (a burst of requests to a faulty or dead host asks it once, not each).
  if now_ms() - (polled_at[name] or 0) >= STATUS_POLL_MS then
    update_planned(name, backend)
  end
  local deadline = planned_until(name)
  if deadline == nil or now_ms() >= deadline then
    return
  end
  local shutdown = shutdown_holds[name] or { waiting = {}, held = 0, longest_ms = 0, until_ms = deadline }
  shutdown_holds[name] = shutdown
  wait(txn, shutdown, function()
    local until_ms = planned_until(name)
    shutdown.until_ms = until_ms or now_ms()
    return until_ms ~= nil and now_ms() < until_ms and not serving(backend)
  end)
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
  for name, hold in pairs(shutdown_holds) do
    lines[#lines + 1] = as_json(name, hold):gsub("}$", ',"reason":"shutdown"}')
  end
  applet:send("[" .. table.concat(lines, ",") .. "]\n")
end)
