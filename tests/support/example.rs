//! The example config (`config/geogate.toml`) switched to the partitioned
//! state backend, for the tests of that backend's checks.

/// The example with `[state] backend = "partitioned"` at `url` and 8
/// partitions.
pub fn with_partitioned_state(url: &str) -> String {
    let text = std::fs::read_to_string("config/geogate.toml").expect("example config");
    // Only the [state] section's commented keys are switched on: the
    // global allowance documents a `urls` line too.
    let (head, state) = text.split_at(text.find("[state]").expect("a [state] section"));
    let switched = state
        .replace("# backend = \"embedded\"", "backend = \"partitioned\"")
        .replace(
            "# urls = [\"nats://127.0.0.1:4222\"]",
            &format!("urls = [\"{url}\"]"),
        )
        .replace("# partitions = 16", "partitions = 8");
    assert_eq!(
        switched.matches("\nbackend = ").count()
            + switched.matches("\nurls = ").count()
            + switched.matches("\npartitions = ").count(),
        3,
        "the example documents backend, urls and partitions under [state]"
    );
    format!("{head}{switched}")
}
