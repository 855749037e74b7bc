-- Registers one instance's fence set and returns the live ones.
-- KEYS[1]: the hash of instance -> "fingerprint ms" (ms by Redis TIME).
-- ARGV[1]: this instance; ARGV[2]: its fingerprint, or "" when it leaves;
-- ARGV[3]: ms after which an instance that has not registered is not live
-- (it is deleted after ten times that).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[3])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return {}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. now)
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  local fp, ms = string.match(all[i + 1], '^(%S+) (%d+)$')
  local age = ms and (now - tonumber(ms)) or math.huge
  if age <= window then
    live[#live + 1] = all[i]
    live[#live + 1] = fp
  elseif age > 10 * window then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return live
