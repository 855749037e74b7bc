//! Capture, synth, replay (virtual and live), record, the labs and the demo,
//! through the real binary.

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn geogate(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_geogate"))
        .args(args)
        .output()
        .expect("run geogate");
    assert!(
        out.status.success(),
        "geogate {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn small_capture(dir: &Path) -> String {
    let path = dir.join("small.ndjson.gz").display().to_string();
    geogate(&[
        "synth",
        "shift-change",
        "--vehicles",
        "30",
        "--seed",
        "7",
        "--drive-s",
        "20",
        "--out",
        &path,
    ]);
    path
}

#[test]
fn virtual_replay_is_byte_identical_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let capture = small_capture(dir.path());
    let run = |report: &str| {
        let report = dir.path().join(report).display().to_string();
        let out = geogate(&[
            "replay",
            &capture,
            "--virtual",
            "--gate",
            "token:rate=50,burst=100",
            "--gate",
            "leaky_meter:rate=50,burst=100",
            "--gate",
            "leaky_shaper:rate=50,burst=100",
            "--shards",
            "2",
            "--queue",
            "64",
            "--service-rate",
            "150",
            "--report",
            &report,
            "--format",
            "json",
        ]);
        let files: Vec<Vec<u8>> = [
            "summary.csv",
            "shed_per_second.csv",
            "shed_per_second.svg",
            "report.html",
        ]
        .iter()
        .map(|f| std::fs::read(Path::new(&report).join(f)).expect("report file"))
        .collect();
        (out.stdout, files)
    };
    let (a, files_a) = run("r1");
    let (b, files_b) = run("r2");
    assert_eq!(a, b, "identical JSON");
    assert_eq!(files_a, files_b, "identical report files");
    let report: Value = serde_json::from_slice(&a).unwrap();
    let gates = report["gates"].as_array().unwrap();
    assert_eq!(gates.len(), 3);
    // Token bucket and meter decide identically; the burst sheds something.
    assert_eq!(gates[0]["shed"], gates[1]["shed"]);
    assert!(gates[0]["shed"].as_u64().unwrap() > 0, "{}", gates[0]);
    for g in gates {
        let total = g["admitted"].as_u64().unwrap()
            + g["shed"].as_u64().unwrap()
            + g["invalid"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum::<u64>();
        assert_eq!(
            total,
            g["offered"].as_u64().unwrap(),
            "every message accounted for"
        );
        assert_eq!(
            g["shed_per_second"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .sum::<u64>(),
            g["shed"].as_u64().unwrap()
        );
    }
}

#[test]
fn lab_shaping_matches_the_golden_csvs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lab");
    let printed = geogate(&[
        "lab",
        "shaping",
        "--out",
        out.to_str().unwrap(),
        "--format",
        "json",
    ]);
    for (produced, golden) in [
        ("shaping.csv", "lab_shaping.csv"),
        ("shaping_windows.csv", "lab_shaping_windows.csv"),
    ] {
        let a = std::fs::read(out.join(produced)).unwrap();
        let b = std::fs::read(Path::new("tests/golden").join(golden)).unwrap();
        assert!(a == b, "{produced} differs from tests/golden/{golden}");
    }
    // The golden files themselves, derived again by an independent model
    // (tests/golden/derive.py, standard-library Python).
    if let Some(python) = support::require("python3", support::binary("python3")) {
        let again = dir.path().join("derived");
        std::fs::create_dir_all(&again).unwrap();
        let status = Command::new(python)
            .arg("tests/golden/derive.py")
            .arg(&again)
            .status()
            .unwrap();
        assert!(status.success(), "derive.py failed");
        for golden in ["lab_shaping.csv", "lab_shaping_windows.csv"] {
            assert_eq!(
                std::fs::read_to_string(again.join(golden)).unwrap(),
                std::fs::read_to_string(Path::new("tests/golden").join(golden)).unwrap(),
                "derive.py disagrees with tests/golden/{golden}"
            );
        }
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    for (file, sha) in manifest["outputs_sha256"].as_object().unwrap() {
        assert_eq!(
            sha.as_str().unwrap(),
            geogate::report::sha256_file(&out.join(file)).unwrap(),
            "{file}"
        );
    }
    let rows = json(&printed);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 20);
    assert_eq!(rows[0]["limiter"], "token-bucket");
    // Same decisions, different place to wait: the shaper never exceeds the
    // server's 100 rps downstream; the token bucket's peak grows with b.
    for (t, l) in rows[..10].iter().zip(&rows[10..]) {
        assert_eq!(t["reject_pct"], l["reject_pct"]);
        assert!(l["downstream_peak"].as_u64().unwrap() <= 100);
    }
    assert!(
        rows[9]["downstream_peak"].as_u64().unwrap() > rows[0]["downstream_peak"].as_u64().unwrap()
    );
}

#[test]
fn lab_window_fixed_window_exceeds_its_limit_bucket_keeps_its_bound() {
    let lab = json(&geogate(&[
        "lab", "window", "--rate", "5", "--burst", "3", "--format", "json",
    ]));
    let bound = lab["bound_per_second"].as_f64().unwrap();
    assert_eq!(bound, 8.0);
    // README's claim: the fixed window advertising 5/s admits 10, twice
    // its limit, in the second that straddles its boundary.
    assert_eq!(
        lab["fixed_window"]["worst_second"].as_u64(),
        Some(10),
        "{lab}"
    );
    assert!(
        lab["token_bucket"]["worst_second"].as_f64().unwrap() <= bound,
        "{lab}"
    );
}

#[test]
fn lab_trace_reproduces_the_worked_examples() {
    let dir = tempfile::tempdir().unwrap();
    // `geogate lab trace --gate GATE` over a trace file, as JSON.
    let lab_trace = |gate: &str, name: &str, lines: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, lines).unwrap();
        json(&geogate(&[
            "lab",
            "trace",
            "--gate",
            gate,
            "--trace",
            &p.display().to_string(),
            "--format",
            "json",
        ]))
    };
    // Capacity 20, refill 5/s: 20 at once, the 21st refused; 0.4 s later two
    // more; after 2 s idle ten; a cost-5 request spends five.
    let mut csv = String::from("t_ms,cost\n");
    csv.push_str(&"0,1\n".repeat(21));
    csv.push_str(&"400,1\n".repeat(3));
    csv.push_str(&"2400,1\n".repeat(11));
    csv.push_str("3400,5\n3400,1\n");
    let r = lab_trace("token:rate=5,burst=20", "a.csv", &csv);
    let admitted: Vec<bool> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["admitted"].as_bool().unwrap())
        .collect();
    assert_eq!(admitted[..21].iter().filter(|a| **a).count(), 20);
    assert!(!admitted[20]);
    assert_eq!(r["decisions"][20]["retry_after_ms"].as_f64(), Some(200.0));
    assert_eq!(admitted[21..24], [true, true, false]);
    assert_eq!(admitted[24..35].iter().filter(|a| **a).count(), 10);
    assert_eq!(admitted[35..], [true, false]);
    assert_eq!(r["decisions"][35]["level_after"].as_f64(), Some(0.0));
    assert_eq!(r["bound_holds"], true);

    // r = 1/s, b = 3: twenty idle seconds hold three tokens.
    let csv = format!("{}{}", "0\n".repeat(3), "20000\n".repeat(7));
    let r = lab_trace("token:rate=1,burst=3", "b.csv", &csv);
    let late: Vec<bool> = r["decisions"].as_array().unwrap()[3..]
        .iter()
        .map(|d| d["admitted"].as_bool().unwrap())
        .collect();
    assert_eq!(late.iter().filter(|a| **a).count(), 3);

    // A shaper at 5/s given 20 at once releases the 20th 3.8 s after the first.
    let r = lab_trace("leaky_shaper:rate=5,burst=20", "c.csv", &"0\n".repeat(20));
    let releases: Vec<f64> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["release_ms"].as_f64().unwrap())
        .collect();
    assert_eq!((releases[0], releases[19]), (0.0, 3800.0));
}

#[test]
fn record_captures_what_a_live_replay_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let capture = small_capture(dir.path());
    let port = support::free_port();
    geogate::broker::start(port).expect("embedded broker");
    let url = format!("mqtt://127.0.0.1:{port}");
    let recorded = dir.path().join("recorded.ndjson");
    let messages = geogate::replay::capture::read(Path::new(&capture))
        .unwrap()
        .len();
    // Stops by itself after exactly that many messages: no time window.
    let mut recorder = Command::new(env!("CARGO_BIN_EXE_geogate"))
        .args([
            "record",
            "--mqtt",
            &url,
            "--topic",
            "fleet/#",
            "--topic",
            "owntracks/#",
            "--out",
            recorded.to_str().unwrap(),
            "--count",
            &messages.to_string(),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("record");
    // Replay only once the recorder says its subscriptions are confirmed.
    let mut stderr = std::io::BufReader::new(recorder.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("recording: subscribed") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(n > 0, "the recorder exited before subscribing");
    }
    geogate(&["replay", &capture, "--mqtt", &url, "--speed", "25"]);
    support::geogate::wait_until(60, "the recorder to finish", || {
        recorder.try_wait().unwrap().is_some()
    });
    assert!(recorder.wait().unwrap().success());
    let original = geogate::replay::capture::read(Path::new(&capture)).unwrap();
    let got = geogate::replay::capture::read(&recorded).unwrap();
    assert_eq!(got.len(), original.len());
    let mut a: Vec<_> = original
        .iter()
        .map(|r| (r.topic.clone(), r.payload_bytes()))
        .collect();
    let mut b: Vec<_> = got
        .iter()
        .map(|r| (r.topic.clone(), r.payload_bytes()))
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "every payload recorded byte for byte");
}

#[test]
fn demo_runs_end_to_end_on_a_small_capture() {
    let dir = tempfile::tempdir().unwrap();
    let capture = small_capture(dir.path());
    let config = std::fs::read_to_string("config/geogate.toml")
        .unwrap()
        .replace(
            "# capture = \"replay/shift-change.ndjson.gz\"",
            &format!("capture = \"{capture}\""),
        )
        .replace(
            "# report_dir = \"geogate-report\"",
            &format!("report_dir = \"{}/report\"", dir.path().display()),
        )
        .replace("# speed = 3.0 ", "speed = 10.0 ")
        .replace("# port = 1883", &format!("port = {}", support::free_port()))
        .replace(
            "# listen = \"127.0.0.1:9464\"",
            &format!("listen = \"127.0.0.1:{}\"", support::free_port()),
        );
    let path = dir.path().join("demo.toml");
    std::fs::write(&path, config).unwrap();
    let out = geogate(&["demo", "--config", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = support::geogate::accounting_line(&stdout);
    assert!(
        line.ends_with("(balanced)") && line.contains("in_queue 0"),
        "{line}"
    );
    let messages = geogate::replay::capture::read(Path::new(&capture))
        .unwrap()
        .len();
    assert!(
        line.starts_with(&format!("accounting: received {messages} ")),
        "{line}"
    );
    let report = std::fs::read_to_string(dir.path().join("report/report.html")).unwrap();
    assert!(report.contains("<svg") && report.contains("watermark"));
    assert!(stdout.contains("queues s0"), "live progress was shown");
    // The map: fences (circles as circles), tracks, enter/exit markers.
    let map = std::fs::read_to_string(dir.path().join("report/map.svg")).unwrap();
    assert!(report.contains(&map[..200]), "the map is in the page");
    use geogate::report::map::{ENTER, EXIT, FENCE};
    let markers = |fill: &str| map.matches(&format!(r#"r="4" fill="{fill}""#)).count();
    assert_eq!(
        map.matches(&format!(r#"fill="{FENCE}" fill-opacity="0.15""#))
            .count(),
        12,
        "every part of the 11 demo fences is drawn (city-centre has two)"
    );
    assert_eq!(
        map.matches("<circle").count() - markers(ENTER) - markers(EXIT),
        7,
        "the 7 circular fences are drawn as circles"
    );
    // One of each colour is the legend's.
    assert!(
        markers(ENTER) > 1 && markers(EXIT) > 1,
        "enter and exit markers"
    );

    // In a real browser: no console output, and the map's own colours on
    // screen (fence outlines, enter and exit markers).
    let Some(page) =
        support::browser::check_page(&dir.path().join("report/report.html"), 900, 1400)
    else {
        return;
    };
    assert!(page.console.is_empty(), "console: {:?}", page.console);
    // The console check can fail: a page that logs an error is caught.
    let noisy = dir.path().join("noisy.html");
    std::fs::write(
        &noisy,
        "<html><body><script>console.error('x')</script></body></html>",
    )
    .unwrap();
    let caught = support::browser::check_page(&noisy, 200, 200).expect("chromium ran above");
    assert_eq!(caught.console.len(), 1, "{:?}", caught.console);
    // The legend is drawn translucent: only the map itself has these exact
    // colours.
    for (what, colour, at_least) in [
        ("fence outlines", FENCE, 200),
        ("enter markers", ENTER, 20),
        ("exit markers", EXIT, 20),
    ] {
        let n = page.count_colour(colour);
        assert!(
            n >= at_least,
            "{what}: {n} pixels of {colour} in a {}x{} screenshot",
            page.width,
            page.height
        );
    }
}

/// The demo as a new user meets it: no arguments, run from an empty
/// directory, so the config, fences and capture must be compiled in.
#[test]
fn demo_runs_from_an_empty_directory_with_nothing_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_geogate"))
        .arg("demo")
        .current_dir(dir.path())
        .output()
        .expect("run geogate demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = support::geogate::accounting_line(&stdout);
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("replay/shift-change.ndjson.gz");
    let messages = geogate::replay::capture::read(&bundled).unwrap().len();
    assert!(
        line.starts_with(&format!("accounting: received {messages} "))
            && line.ends_with("(balanced)"),
        "{line}"
    );
    let report = dir.path().join("geogate-report/report.html");
    assert!(std::fs::read_to_string(&report).unwrap().contains("<svg"));
    assert!(
        stdout.contains("report: geogate-report/report.html"),
        "{stdout}"
    );
}
