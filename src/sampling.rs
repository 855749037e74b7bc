//! How often the per-message histograms are fed.

/// One in this many is recorded in the two histograms that every message
/// would otherwise feed: `geogate_evaluation_duration_seconds` (each
/// worker's evaluations) and `geogate_end_to_end_latency_seconds` (each
/// shard's finished messages). Why not every one: a recording costs a
/// clock read, atomic operations and a memory fence in the exporter, then
/// its share of the next scrape's drain; `perf` put the evaluation's timing
/// at about 3% of the in-process pipeline, more than the evaluation itself
/// (2.5%), and callgrind the end-to-end one at about 190 instructions per
/// message, against about 3,000 for every stage after decoding together.
/// Quantiles need a fair sample, and a fixed stride is one. Seven, not
/// eight: batches and bursts are multiples of 8, so every eighth would keep
/// landing on the same places in each batch, such as its first, cold
/// evaluation.
pub const SAMPLE_EVERY: u64 = 7;
