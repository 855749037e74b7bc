//! The JSON step of decoding, three ways, on the bundled capture's real
//! payloads: serde_json (what `codec::decode` uses), sonic-rs and simd-json,
//! each deserializing the codec's own [`Wire`] shape through serde, split
//! into native fixes, OwnTracks locations and the payloads the codec
//! refuses. simd-json parses in place, so its rate includes the copy of
//! each payload it needs (a received payload is shared and immutable).
//!
//! Before timing, every payload's outcome (parsed or refused) must agree
//! across the three parsers, or the comparison would not be like for like.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use geogate::codec::{CodecSettings, Wire, decode};
use geogate::replay::capture;
use std::hint::black_box;
use std::path::Path;

struct Sets {
    native: Vec<Vec<u8>>,
    owntracks: Vec<Vec<u8>>,
    refused: Vec<Vec<u8>>,
}

fn sets() -> Sets {
    let settings = CodecSettings::default();
    let mut sets = Sets {
        native: Vec::new(),
        owntracks: Vec::new(),
        refused: Vec::new(),
    };
    for r in capture::read(Path::new("replay/shift-change.ndjson.gz")).expect("bundled capture") {
        let payload = r.payload_bytes();
        match decode(&r.topic, &payload, &settings) {
            Ok(_) if r.topic.starts_with("owntracks/") => sets.owntracks.push(payload),
            Ok(_) => sets.native.push(payload),
            Err(_) => sets.refused.push(payload),
        }
    }
    sets
}

fn with_serde_json(payload: &[u8]) -> bool {
    serde_json::from_slice::<Wire>(payload).is_ok()
}

fn with_sonic_rs(payload: &[u8]) -> bool {
    sonic_rs::from_slice::<Wire>(payload).is_ok()
}

fn with_simd_json(payload: &[u8]) -> bool {
    let mut copy = payload.to_vec();
    simd_json::serde::from_slice::<Wire>(&mut copy).is_ok()
}

type Parser = fn(&[u8]) -> bool;

const PARSERS: [(&str, Parser); 3] = [
    ("serde_json", with_serde_json),
    ("sonic_rs", with_sonic_rs),
    ("simd_json", with_simd_json),
];

fn json(c: &mut Criterion) {
    let sets = sets();
    eprintln!(
        "payloads: {} native, {} OwnTracks, {} refused",
        sets.native.len(),
        sets.owntracks.len(),
        sets.refused.len()
    );
    for (name, set) in [
        ("native", &sets.native),
        ("owntracks", &sets.owntracks),
        ("refused", &sets.refused),
    ] {
        for payload in set {
            let outcomes: Vec<bool> = PARSERS.iter().map(|(_, parse)| parse(payload)).collect();
            assert!(
                outcomes.iter().all(|&o| o == outcomes[0]),
                "{name}: parsers disagree ({outcomes:?}) on {}",
                String::from_utf8_lossy(payload)
            );
        }
        let mut group = c.benchmark_group(format!("json/{name}"));
        group.throughput(Throughput::Elements(set.len() as u64));
        for (parser, parse) in PARSERS {
            group.bench_function(parser, |b| {
                b.iter(|| {
                    set.iter()
                        .filter(|p| parse(black_box(p.as_slice())))
                        .count()
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, json);
criterion_main!(benches);
