//! Nanoseconds per gate decision, single-threaded, each gate against
//! governor's direct limiter in the same run. Arrivals are a fixed,
//! deterministic trace that mixes admits and rejects (2× the gate's rate).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geogate::admission::{Gate, GateSpec};
use governor::{Quota, RateLimiter, clock::FakeRelativeClock};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

const DECISIONS: u64 = 10_000;
/// Gates run at 1000/s with a burst of 50; arrivals come every 500 µs.
const ARRIVAL_GAP_NS: u64 = 500_000;

fn gates(c: &mut Criterion) {
    let mut group = c.benchmark_group("gate_decision");
    group.throughput(Throughput::Elements(DECISIONS));
    for spec in [
        "token:rate=1000,burst=50",
        "leaky_meter:rate=1000,burst=50",
        "leaky_shaper:rate=1000,burst=50",
        "fixed_window:rate=1000,burst=1000",
    ] {
        let spec: GateSpec = spec.parse().expect("bench spec");
        group.bench_with_input(
            BenchmarkId::new("geogate", spec.kind.as_str()),
            &spec,
            |b, spec| {
                let mut gate = spec.build().expect("bench gate");
                let mut now = 0u64;
                b.iter(|| {
                    let mut admitted = 0u32;
                    for _ in 0..DECISIONS {
                        now += ARRIVAL_GAP_NS;
                        admitted += u32::from(gate.try_admit(black_box(now), 1).is_admit());
                    }
                    admitted
                })
            },
        );
    }
    group.bench_function(BenchmarkId::new("governor", "direct"), |b| {
        let clock = FakeRelativeClock::default();
        let quota = Quota::per_second(NonZeroU32::new(1000).expect("nonzero"))
            .allow_burst(NonZeroU32::new(50).expect("nonzero"));
        let limiter = RateLimiter::direct_with_clock(quota, clock.clone());
        b.iter(|| {
            let mut admitted = 0u32;
            for _ in 0..DECISIONS {
                clock.advance(Duration::from_nanos(ARRIVAL_GAP_NS));
                admitted += u32::from(black_box(&limiter).check().is_ok());
            }
            admitted
        })
    });
    group.finish();
}

criterion_group!(benches, gates);
criterion_main!(benches);
