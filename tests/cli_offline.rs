//! The offline commands as a user runs them: `fences check` and `eval`.

mod support;

use std::process::Command;

fn geogate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_geogate"))
        .args(args)
        .output()
        .expect("run geogate")
}

#[test]
fn fences_check_summarises_good_files_and_lists_every_defect() {
    let ok = geogate(&[
        "fences",
        "check",
        "config/fences.geojson",
        "--format",
        "json",
    ]);
    assert!(ok.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(summary["summary"]["fences"], 11);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.geojson");
    std::fs::write(&bad, r#"{"type":"FeatureCollection","features":[
        {"type":"Feature","id":"a","geometry":{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,1]]]}},
        {"type":"Feature","id":"a","geometry":{"type":"Point","coordinates":[0,0]}}]}"#).unwrap();
    let out = geogate(&["fences", "check", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("feature 0 (id \"a\"): exterior ring is not closed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("feature 1 (id \"a\"): duplicate id"),
        "{stderr}"
    );
    assert!(stderr.contains("radius_m"), "{stderr}");
}

#[test]
fn eval_writes_transitions_skips_bad_lines_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("positions.ndjson");
    // v1 drives through the hospital circle (13.3770, 52.5260, r = 150 m).
    std::fs::write(
        &input,
        concat!(
            r#"{"vehicle":"v1","ts":1700000000000,"lat":52.5200,"lon":13.3770,"speed_kmh":30}"#,
            "\n",
            r#"{"vehicle":"v1","ts":1700000010000,"lat":52.5260,"lon":13.3770,"speed_kmh":30}"#,
            "\n",
            "this is not json\n",
            r#"{"vehicle":"v1","ts":1700000005000,"lat":52.5200,"lon":13.3770}"#,
            "\n",
            "\n",
            r#"{"vehicle":"v1","ts":1700000020000,"lat":52.5300,"lon":13.3770,"speed_kmh":30}"#,
            "\n",
            r#"{"vehicle":"v2","ts":1700000020000,"lat":95,"lon":13.3770}"#,
            "\n",
        ),
    )
    .unwrap();
    let run = |name: &str| {
        let out_path = dir.path().join(name);
        let out = geogate(&[
            "eval",
            "--fences",
            "config/fences.geojson",
            "--input",
            input.to_str().unwrap(),
            "--out",
            out_path.to_str().unwrap(),
            "--format",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (std::fs::read_to_string(out_path).unwrap(), out.stdout)
    };
    let (events, raw_report) = run("a.ndjson");
    let lines: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{events}");
    assert_eq!(
        lines[0],
        serde_json::json!({"vehicle":"v1","fence":"hospital","event":"enter","ts":1700000010000u64,"fence_version":1})
    );
    assert_eq!(lines[1]["event"], "exit");
    let report: serde_json::Value = serde_json::from_slice(&raw_report).unwrap();
    assert_eq!(report["skipped"], 2);
    assert_eq!(report["skipped_lines"][0]["line"], 3);
    assert_eq!(report["skipped_lines"][1]["reason"], "out_of_range");
    assert_eq!(report["late"], 1);
    assert_eq!(
        report["per_fence"]["hospital"],
        serde_json::json!({"enter": 1, "exit": 1})
    );
    assert_eq!(
        run("b.ndjson"),
        (events, raw_report),
        "byte-identical on a rerun"
    );
}

#[test]
fn fences_check_warns_about_clamped_float_noise_and_accepts_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let noisy = dir.path().join("noisy.geojson");
    std::fs::write(
        &noisy,
        r#"{"type":"FeatureCollection","features":[
        {"type":"Feature","id":"east","properties":{},"geometry":{"type":"Polygon","coordinates":
          [[[170,60],[180.00000000000006,60],[180.00000000000006,70],[170,70],[170,60]]]}}]}"#,
    )
    .unwrap();
    let out = geogate(&["fences", "check", noisy.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout
            .matches("warning: feature 0 (id \"east\"): exterior ring position")
            .count(),
        2,
        "{stdout}"
    );
    let json = geogate(&[
        "fences",
        "check",
        noisy.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(2));
}

#[test]
fn run_without_a_config_says_how_to_start_and_the_example_is_valid() {
    let out = geogate(&["run"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("geogate config example") && stderr.contains("geogate demo"),
        "{stderr}"
    );
    let example = geogate(&["config", "example"]);
    assert!(example.status.success());
    let text = String::from_utf8(example.stdout).unwrap();
    assert_eq!(
        text,
        std::fs::read_to_string("config/geogate.toml").unwrap()
    );
    assert!(geogate::config::Config::parse(&text).is_ok());
    let fences = geogate(&["fences", "example"]);
    assert!(fences.status.success());
    let fences = String::from_utf8(fences.stdout).unwrap();
    assert_eq!(
        fences,
        std::fs::read_to_string("config/fences.geojson").unwrap()
    );
    let parsed = geogate::geofence::parse_fences(&fences).expect("valid fences");
    assert_eq!(parsed.len(), 11);
}

/// `--reset-state` with the partitioned backend is refused, saying why:
/// one instance never resets state every instance shares.
#[test]
fn reset_state_is_refused_for_the_partitioned_state() {
    let dir = tempfile::tempdir().unwrap();
    let config = support::example::with_partitioned_state("nats://127.0.0.1:1").replace(
        "path = \"config/fences.geojson\"",
        &format!(
            "path = \"{}/config/fences.geojson\"",
            env!("CARGO_MANIFEST_DIR")
        ),
    );
    let path = dir.path().join("geogate.toml");
    std::fs::write(&path, config).unwrap();
    let out = geogate(&["run", "--config", path.to_str().unwrap(), "--reset-state"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--reset-state") && stderr.contains("partitioned"),
        "{stderr}"
    );
}
