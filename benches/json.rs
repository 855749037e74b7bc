//! The JSON step of decoding, three ways, on the bundled capture's real
//! payloads: serde_json (what `codec::decode` uses), sonic-rs and simd-json,
//! each deserializing the codec's two shapes through serde (the typed one
//! `codec::decode` reads first, [`Typed`], and the loose one it falls back
//! to, [`Wire`]), split into native fixes, OwnTracks locations and the
//! payloads the codec refuses. simd-json parses in place, so its rate includes the copy of
//! each payload it needs (a received payload is shared and immutable).
//!
//! Before timing, every payload's outcome (parsed or refused) must agree
//! across the three parsers of a shape, or the comparison would not be
//! like for like.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use geogate::codec::typed::{self, Typed};
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

fn loose_serde_json(payload: &[u8]) -> bool {
    serde_json::from_slice::<Wire>(payload).is_ok()
}

fn loose_sonic_rs(payload: &[u8]) -> bool {
    sonic_rs::from_slice::<Wire>(payload).is_ok()
}

fn loose_simd_json(payload: &[u8]) -> bool {
    let mut copy = payload.to_vec();
    simd_json::serde::from_slice::<Wire>(&mut copy).is_ok()
}

/// The codec's own typed reading, after the UTF-8 check `decode` makes.
fn typed_serde_json(payload: &[u8]) -> bool {
    std::str::from_utf8(payload).is_ok_and(|text| typed::read(text).is_some())
}

fn typed_sonic_rs(payload: &[u8]) -> bool {
    sonic_rs::from_slice::<Typed>(payload).is_ok()
}

fn typed_simd_json(payload: &[u8]) -> bool {
    let mut copy = payload.to_vec();
    simd_json::serde::from_slice::<Typed>(&mut copy).is_ok()
}

type Parser = fn(&[u8]) -> bool;

const SHAPES: [(&str, [(&str, Parser); 3]); 2] = [
    (
        "typed",
        [
            ("serde_json", typed_serde_json),
            ("sonic_rs", typed_sonic_rs),
            ("simd_json", typed_simd_json),
        ],
    ),
    (
        "loose",
        [
            ("serde_json", loose_serde_json),
            ("sonic_rs", loose_sonic_rs),
            ("simd_json", loose_simd_json),
        ],
    ),
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
        for (shape, parsers) in SHAPES {
            for payload in set {
                let outcomes: Vec<bool> = parsers.iter().map(|(_, parse)| parse(payload)).collect();
                assert!(
                    outcomes.iter().all(|&o| o == outcomes[0]),
                    "{name}, {shape}: parsers disagree ({outcomes:?}) on {}",
                    String::from_utf8_lossy(payload)
                );
            }
            let mut group = c.benchmark_group(format!("json/{name}/{shape}"));
            group.throughput(Throughput::Elements(set.len() as u64));
            for (parser, parse) in parsers {
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
}

criterion_group!(benches, json);
criterion_main!(benches);
