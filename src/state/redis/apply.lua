-- Applies a batch of fixes of one partition to the vehicles' shared state,
-- with the rules of geofence::Evaluator, and appends every transition to
-- the partition's outbox stream, all in one atomic step.
--
-- KEYS[1]      the partition's outbox stream
-- KEYS[1 + i]  the state key of fix i's vehicle (repeated for repeats)
-- ARGV[1]      max memberships per vehicle
-- ARGV[2]      idle expiry, ms (the state key's time to live)
-- ARGV[3]      JSON: [[vehicle, fix ms, redelivered 0|1,
--                      [[fence, clear 0|1, dwell ms], ...] (containing, index order),
--                      [fence, ...] (near: not containing, inside the band),
--                      message digest (hex)], ...]
--
-- State (JSON): {"t": last applied fix ms, "d": [digests applied at t],
--                "m": [member fences], "p": [[fence, first qualifying fix ms], ...]}
-- Returns {outcomes, overflows, enters, exits, lateness}: one letter per
-- fix, a(pplied), l(ate) or d(uplicate); how many enters max memberships
-- refused; how many enters and exits were appended to the outbox; and for
-- each late fix in order, how many ms behind the last applied fix it was.
local max_members = tonumber(ARGV[1])
local ttl = ARGV[2]
local fixes = cjson.decode(ARGV[3])
local states = {}
local order = {}
local outcomes = {}
local lateness = {}
local overflows = 0
local enters, exits = 0, 0

for i, fix in ipairs(fixes) do
  local key = KEYS[i + 1]
  local st = states[key]
  if st == nil then
    local raw = redis.call('GET', key)
    if raw then
      st = cjson.decode(raw)
    else
      st = {m = {}, p = {}}
    end
    states[key] = st
    table.insert(order, key)
  end
  local vehicle, ts, redelivered, digest = fix[1], fix[2], fix[3], fix[6]
  local seen = false
  if st.t ~= nil and ts == st.t then
    for _, d in ipairs(st.d or {}) do
      if d == digest then
        seen = true
      end
    end
  end
  if seen or (st.t ~= nil and redelivered == 1 and ts < st.t) then
    table.insert(outcomes, 'd')
  elseif st.t ~= nil and ts < st.t then
    table.insert(outcomes, 'l')
    table.insert(lateness, st.t - ts)
  else
    table.insert(outcomes, 'a')
    if st.t ~= ts or st.d == nil then
      st.d = {}
    end
    if #st.d < 4 then
      table.insert(st.d, digest)
    end
    st.t = ts
    st.changed = true
    local containing, clear = {}, {}
    for _, f in ipairs(fix[4]) do
      containing[f[1]] = true
      clear[f[1]] = (f[2] == 1)
    end
    local near = {}
    for _, id in ipairs(fix[5]) do
      near[id] = true
    end
    -- Exits first: a member stays while it contains the point or the
    -- point is inside its band.
    local members, is_member = {}, {}
    for _, m in ipairs(st.m) do
      if containing[m] or near[m] then
        table.insert(members, m)
        is_member[m] = true
      else
        redis.call('XADD', KEYS[1], '*', 'v', vehicle, 'f', m, 'e', 'exit', 't', ts)
        exits = exits + 1
      end
    end
    -- Then enters, with dwell bookkeeping.
    local since_of = {}
    for _, pd in ipairs(st.p) do
      since_of[pd[1]] = pd[2]
    end
    local pending = {}
    for _, f in ipairs(fix[4]) do
      local id, dwell = f[1], f[3]
      if not is_member[id] and clear[id] then
        local since = since_of[id] or ts
        if dwell > 0 and ts - since < dwell then
          table.insert(pending, {id, since})
        elseif #members >= max_members then
          overflows = overflows + 1
        else
          table.insert(members, id)
          is_member[id] = true
          redis.call('XADD', KEYS[1], '*', 'v', vehicle, 'f', id, 'e', 'enter', 't', ts)
          enters = enters + 1
        end
      end
    end
    while #pending > max_members do
      table.remove(pending)
    end
    st.m = members
    st.p = pending
  end
end

for _, key in ipairs(order) do
  local st = states[key]
  if st.changed then
    st.changed = nil
    redis.call('SET', key, cjson.encode(st), 'PX', ttl)
  end
end
return {table.concat(outcomes), overflows, enters, exits, lateness}
