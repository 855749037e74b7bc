//! Config validation reports every problem at once, each with its field.

mod support;

use geogate::config::{Config, ConfigError};

#[test]
fn example_config_is_valid() {
    let config = Config::load(std::path::Path::new("config/geogate.toml")).expect("example config");
    assert_eq!(config.pipeline.watermark, 0.6);
    assert_eq!(config.gate.burst, 24000);
}

#[test]
fn every_problem_is_reported_with_its_field() {
    let text = std::fs::read_to_string("config/geogate.toml")
        .unwrap()
        .replace("client_id = \"geogate-1\"", "client_id = \"\"")
        .replace("rate = 32000", "rate = nan")
        .replace("burst = 24000", "burst = 0")
        .replace("# watermark = 0.6", "watermark = 1.5")
        .replace("# listen = \"127.0.0.1:9464\"", "listen = \"nowhere\"")
        .replace("# dwell_s = 0 ", "dwell_s = -1 ")
        .replace("# subscribe_qos = 1 ", "subscribe_qos = 2 ")
        .replace("# connect_timeout_s = 10 ", "connect_timeout_s = 0 ")
        .replace("# decode_lanes = 0 ", "decode_lanes = 65 ")
        .replace("# shards = 0 ", "shards = 4097 ");
    let Err(ConfigError::Invalid(problems)) = Config::parse(&text) else {
        panic!("expected an invalid config");
    };
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    for expected in [
        "mqtt.client_id",
        "pipeline.watermark",
        "gate.rate",
        "fences.dwell_s",
        "metrics.listen",
        "mqtt.subscribe_qos",
        "mqtt.connect_timeout_s",
        "pipeline.decode_lanes",
        "pipeline.shards",
    ] {
        assert!(
            fields.contains(&expected),
            "{expected} missing from {problems:#?}"
        );
    }
    let rate = problems.iter().find(|p| p.field == "gate.rate").unwrap();
    assert!(rate.message.contains("finite"), "{}", rate.message);
    // burst = 0 is reported too once the rate is fixed.
    let text = text.replace("rate = nan", "rate = 5");
    let Err(ConfigError::Invalid(problems)) = Config::parse(&text) else {
        panic!()
    };
    assert!(
        problems
            .iter()
            .any(|p| p.field == "gate.burst" && p.message.contains("≥ 1"))
    );
}

#[test]
fn unknown_keys_and_lab_only_gates_are_refused() {
    let text = std::fs::read_to_string("config/geogate.toml").unwrap();
    let typo = text.replace("[pipeline]", "[pipeline]\nwatermrk = 0.5");
    let err = Config::parse(&typo).unwrap_err().to_string();
    assert!(err.contains("watermrk"), "{err}");
    let lab = text.replace("kind = \"token\"", "kind = \"fixed_window\"");
    let err = Config::parse(&lab).unwrap_err().to_string();
    assert!(
        err.contains("gate.kind") && err.contains("lab-only"),
        "{err}"
    );
}

#[test]
fn password_is_redacted_in_debug_output() {
    let text = std::fs::read_to_string("config/geogate.toml")
        .unwrap()
        .replace("# password = \"secret\"", "password = \"hunter2\"");
    let config = Config::parse(&text).unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("hunter2") && debug.contains("<redacted>"));
}

#[test]
fn the_state_section_is_checked_and_names_its_field() {
    let text = std::fs::read_to_string("config/geogate.toml").unwrap();
    let nowhere = text.replace(
        "# path = \"geogate-state.sqlite\"",
        "path = \"/no/such/dir/state.sqlite\"",
    );
    let Err(ConfigError::Invalid(problems)) = Config::parse(&nowhere) else {
        panic!("expected an invalid config");
    };
    let problem = problems.iter().find(|p| p.field == "state.path").unwrap();
    assert!(
        problem.message.contains("/no/such/dir"),
        "{}",
        problem.message
    );
    // The memory backend needs no file.
    let memory = nowhere.replace("# backend = \"embedded\"", "backend = \"memory\"");
    assert!(Config::parse(&memory).is_ok());
    let unknown = text.replace("# backend = \"embedded\"", "backend = \"postgres\"");
    let err = Config::parse(&unknown).unwrap_err().to_string();
    assert!(err.contains("backend") && err.contains("embedded"), "{err}");
}

/// `[gate.global]`: the documented example parses; each bad field is named;
/// the fail mode must be chosen, not defaulted.
#[test]
fn the_global_allowance_is_checked_and_names_its_field() {
    let text = std::fs::read_to_string("config/geogate.toml").unwrap();
    let start = text
        .find("# [gate.global]")
        .expect("documented in the example");
    let end = text[start..].find("\n\n").map_or(text.len(), |n| start + n);
    let uncommented: String = text[start..end]
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let enabled = format!("{}{}{}", &text[..start], uncommented, &text[end..]);
    let config = Config::parse(&enabled).expect("the documented [gate.global] is valid");
    let global = config.gate.global.expect("global allowance");
    assert_eq!(
        (global.rate, global.burst, global.reserve),
        (5000.0, 10000, 32)
    );

    let bad = enabled
        .replace(
            "urls = [\"redis://127.0.0.1:6379\"]",
            "urls = [\"http://x\", \"redis://127.0.0.1:6380\"]",
        )
        .replace("rate = 5000 ", "rate = 0 ")
        .replace("reserve = 32", "reserve = 20000");
    let Err(ConfigError::Invalid(problems)) = Config::parse(&bad) else {
        panic!("expected an invalid config");
    };
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    for field in [
        "gate.global.urls",
        "gate.global.cluster",
        "gate.global.rate",
        "gate.global.reserve",
    ] {
        assert!(fields.contains(&field), "{field} not in {problems:?}");
    }
    let url = problems
        .iter()
        .find(|p| p.field == "gate.global.urls")
        .unwrap();
    assert!(url.message.contains("http://x"), "{}", url.message);

    let no_mode: String = enabled
        .lines()
        .filter(|l| !l.starts_with("fail_mode"))
        .collect::<Vec<_>>()
        .join("\n");
    let err = Config::parse(&no_mode).unwrap_err().to_string();
    assert!(err.contains("fail_mode"), "{err}");
}

/// `[state] backend = "redis"` (retired) still parses, keys only it read
/// included, so that `config check` refuses it by the backend with the way
/// to migrate, not by an unknown key.
#[test]
fn the_retired_redis_state_backend_is_refused_with_the_way_to_migrate() {
    let text = std::fs::read_to_string("config/geogate.toml").unwrap();
    let (head, state) = text.split_at(text.find("[state]").unwrap());
    let redis = format!(
        "{head}{}",
        state.replacen(
            "[state]\n",
            "[state]\nbackend = \"redis\"\nurls = [\"redis://127.0.0.1:6379\"]\ncluster = false\nprefix = \"geogate\"\npartitions = 16\nclaim_idle_s = 30\ntimeout_ms = 1000\n",
            1,
        )
    );
    let Err(ConfigError::Invalid(problems)) = Config::parse(&redis) else {
        panic!("expected backend = \"redis\" to be refused");
    };
    assert_eq!(
        problems
            .iter()
            .map(|p| p.field.as_str())
            .collect::<Vec<_>>(),
        ["state.backend"],
        "the backend alone is refused: {problems:?}"
    );
    let message = &problems[0].message;
    assert!(
        message.contains("retired")
            && message.contains("README, \"Migrating from the Redis state backend\"")
            && message.contains("partitioned"),
        "{message}"
    );

    // `geogate config check` says the same.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("geogate.toml");
    std::fs::write(&path, &redis).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_geogate"))
        .args(["config", "check", path.to_str().unwrap()])
        .output()
        .expect("run geogate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("state.backend")
            && stderr.contains("Migrating from the Redis state backend"),
        "{stderr}"
    );
}

/// `[state] backend = "partitioned"` as the example documents it parses
/// and passes the checks; what it needs (urls, partitions, no events
/// file) is named.
#[test]
fn the_partitioned_state_backend_is_checked_and_names_its_field() {
    let partitioned = support::example::with_partitioned_state("nats://127.0.0.1:4222");
    let config = Config::parse(&partitioned).expect("the documented partitioned backend is valid");
    assert_eq!(config.state.partitioned.urls, ["nats://127.0.0.1:4222"]);
    assert_eq!(config.state.partitioned.partitions, 8);
    assert!(config.events.path.is_none());
    let bad = partitioned
        .replace("urls = [\"nats://127.0.0.1:4222\"]", "urls = []")
        .replace("partitions = 8", "partitions = 0")
        .replace(
            "# path = \"geogate-events.ndjson\"",
            "path = \"geogate-events.ndjson\"",
        );
    let Err(ConfigError::Invalid(problems)) = Config::parse(&bad) else {
        panic!("expected an invalid config");
    };
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    for field in ["state.urls", "state.partitions", "events.path"] {
        assert!(fields.contains(&field), "{field} not in {problems:?}");
    }
    // The events stream must outlast what the outputs hold on to, twice
    // over: past events_max_age_s a transition would leave it before its
    // output got to it or gave up on it and dead-lettered it.
    assert!(config.events.mqtt, "the example publishes over MQTT");
    let short = partitioned.replace("# events_max_age_s = 604800", "events_max_age_s = 1199");
    assert_ne!(short, partitioned, "the example documents events_max_age_s");
    let Err(ConfigError::Invalid(problems)) = Config::parse(&short) else {
        panic!(
            "expected a stream kept for less than twice the MQTT output's maximum age to be refused"
        );
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].field, "events.mqtt_max_age_s");
    assert!(problems[0].message.contains("events_max_age_s"));
    let longer = short.replace("events_max_age_s = 1199", "events_max_age_s = 1200");
    Config::parse(&longer).expect("a stream kept twice the output's maximum age");
}

/// A key of one state backend under another is refused by name, not
/// silently ignored: a `path` under `backend = "partitioned"` would
/// otherwise suggest a file that nothing writes.
#[test]
fn a_state_key_the_backend_does_not_read_is_refused_by_name() {
    let partitioned = support::example::with_partitioned_state("nats://127.0.0.1:4222");
    let with_path = partitioned.replace(
        "# path = \"geogate-state.sqlite\"",
        "path = \"geogate-state.sqlite\"",
    );
    assert_ne!(with_path, partitioned, "the example documents state.path");
    let Err(ConfigError::Invalid(problems)) = Config::parse(&with_path) else {
        panic!("expected a path under the partitioned backend to be refused");
    };
    let problem = problems
        .iter()
        .find(|p| p.field == "state.path")
        .unwrap_or_else(|| panic!("state.path not in {problems:?}"));
    assert!(
        problem.message.contains("partitioned"),
        "{}",
        problem.message
    );
    // And the other way round: a partitioned key under the embedded
    // backend, and a key only the retired redis backend read.
    let text = std::fs::read_to_string("config/geogate.toml").unwrap();
    let (head, state) = text.split_at(text.find("[state]").unwrap());
    let foreign = format!(
        "{head}{}",
        state
            .replace(
                "# urls = [\"nats://127.0.0.1:4222\"]",
                "urls = [\"nats://127.0.0.1:4222\"]",
            )
            .replacen("[state]\n", "[state]\nprefix = \"geogate\"\n", 1)
    );
    let Err(ConfigError::Invalid(problems)) = Config::parse(&foreign) else {
        panic!("expected urls and prefix under the embedded backend to be refused");
    };
    assert_eq!(
        problems
            .iter()
            .map(|p| p.field.as_str())
            .collect::<Vec<_>>(),
        ["state.urls", "state.prefix"]
    );
    assert!(problems[1].message.contains("retired"), "{problems:?}");
}
