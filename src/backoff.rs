//! Jittered exponential backoff between reconnects and sink retries: many
//! geogates (or many retries) that failed together do not all come back in
//! the same instant.

use std::time::Duration;

/// Jittered exponential backoff.
pub struct Backoff {
    next: Duration,
    seed: u64,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(10);

    pub fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Self {
            next: Self::MIN,
            seed,
        }
    }

    pub fn reset(&mut self) {
        self.next = Self::MIN;
    }

    pub fn step(&mut self) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = 0.5 + (self.seed % 1000) as f64 / 1000.0;
        let wait = self.next.mul_f64(jitter);
        self.next = (self.next * 2).min(Self::MAX);
        wait
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}
