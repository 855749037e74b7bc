//! The shared bucket, as one Redis script: refill from Redis's own clock,
//! grant whole costs up to what was asked, save, all in one indivisible
//! step (no caller can slip between the comparison and the deduction).
//!
//! Levels are kept in micro-tokens, as integers: `r` tokens/s earns exactly
//! `r` micro-tokens per microsecond of `TIME`, and Lua's doubles hold every
//! value involved exactly (below 2^53), so nothing drifts.

use redis::Script;

/// KEYS[1]: the bucket, a hash `{level (micro-tokens), at (µs of TIME)}`.
/// ARGV: rate (tokens/s), burst (tokens), want (tokens), cost (tokens),
/// expiry (ms). Returns `{granted tokens, µs until one cost fits}` (the
/// second is 0 when the grant covers at least one cost).
///
/// A missing bucket starts full. It expires only after an idle spell long
/// enough to refill it from empty, so recreating it full never grants
/// credit that was not earned. A clock that steps back earns nothing until
/// it passes the saved time again.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local cap = tonumber(ARGV[2]) * 1000000
local want = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local saved = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(saved[1])
local at = tonumber(saved[2])
if level == nil or at == nil then
  level = cap
  at = now
end
if now > at then
  level = math.min(cap, level + math.floor((now - at) * rate))
  at = now
end
local whole = math.floor(level / 1000000)
local grant = math.min(want, whole - whole % cost)
level = level - grant * 1000000
redis.call('HSET', KEYS[1], 'level', string.format('%d', level), 'at', string.format('%d', at))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local wait = 0
if grant < cost then
  wait = math.ceil((cost * 1000000 - level) / rate)
end
return {grant, wait}
";

/// What one call to the shared bucket gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub tokens: u64,
    /// When nothing was granted: how long until one cost would fit.
    pub retry_after_us: u64,
}

/// The bucket's parameters, as the script takes them.
#[derive(Debug, Clone)]
pub struct SharedBucket {
    script: Script,
    pub key: String,
    pub rate: f64,
    pub burst: u32,
    pub cost: u32,
}

impl SharedBucket {
    pub fn new(key: &str, rate: f64, burst: u32, cost: u32) -> Self {
        Self {
            script: Script::new(TAKE),
            key: key.to_owned(),
            rate,
            burst,
            cost,
        }
    }

    /// Idle time after which the bucket would be full again anyway.
    fn expiry_ms(&self) -> u64 {
        (f64::from(self.burst) / self.rate * 1000.0).ceil() as u64 + 1000
    }

    /// Takes up to `want` tokens (whole costs) in one round trip.
    pub async fn take(
        &self,
        link: &mut impl redis::aio::ConnectionLike,
        want: u64,
    ) -> redis::RedisResult<Grant> {
        let (tokens, retry_after_us): (u64, u64) = self
            .script
            .key(&self.key)
            .arg(self.rate)
            .arg(self.burst)
            .arg(want)
            .arg(self.cost)
            .arg(self.expiry_ms())
            .invoke_async(link)
            .await?;
        Ok(Grant {
            tokens,
            retry_after_us,
        })
    }
}
