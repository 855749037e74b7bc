//! The example config (`config/geogate.toml`) switched to the redis state
//! backend, for the tests of that backend's checks.

/// The example with `[state] backend = "redis"` at `url`, 16 partitions,
/// an events file (which that backend needs) and the example's MQTT events.
pub fn with_redis_state(url: &str) -> String {
    let text = std::fs::read_to_string("config/geogate.toml").expect("example config");
    // Only the [state] section's commented keys are switched on: the
    // global allowance documents a `urls` line too.
    let (head, state) = text.split_at(text.find("[state]").expect("a [state] section"));
    let state = state
        .replace("# backend = \"embedded\"", "backend = \"redis\"")
        .replace(
            "# urls = [\"redis://127.0.0.1:6379\"]",
            &format!("urls = [\"{url}\"]"),
        )
        .replace("# partitions = 16", "partitions = 16");
    format!("{head}{state}").replace(
        "# path = \"geogate-events.ndjson\"",
        "path = \"geogate-events.ndjson\"",
    )
}
