//! TLS and credentials on every connection a partitioned fleet makes,
//! against real servers and certificates made here: NATS with TLS and a
//! user (the engine), Redis with TLS and an ACL user (the shared
//! allowance). The right CA and credentials get through; a wrong CA and a
//! wrong password each get their own, precise error.

mod support;

use geogate::redis_link::{RedisLink, RedisProblem, RedisSecurity};
use geogate::scale_out::engine::{EngineError, connect};
use geogate::state::partitioned::config::PartitionedConfig;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::geogate::GeogateProcess;
use support::nats::Nats;
use support::pki::{new_pki, write};

const PASSWORD: &str = "s3cret-pa55";

/// nats-server requiring TLS (a certificate the test's CA signed) and a
/// user with a password.
fn secure_nats(dir: &Path) -> Option<Nats> {
    let pki = new_pki("nats test CA");
    let extra = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\" }}\nauthorization {{ users = [ {{ user: geogate, password: \"{PASSWORD}\" }} ] }}\n",
        write(dir, "server.pem", &pki.server.0),
        write(dir, "server.key", &pki.server.1),
    );
    write(dir, "ca.pem", &pki.ca);
    write(dir, "password", &format!("{PASSWORD}\n"));
    write(dir, "wrong-password", "guess\n");
    write(dir, "other-ca.pem", &new_pki("another CA").ca);
    Nats::start_configured(&extra)
}

fn engine_config(nats: &Nats, dir: &Path, ca: &str, password: &str) -> PartitionedConfig {
    PartitionedConfig {
        urls: vec![nats.url()],
        partitions: 4,
        user: Some("geogate".into()),
        password_file: Some(dir.join(password)),
        ca: Some(dir.join(ca)),
        ..PartitionedConfig::default()
    }
}

#[test]
fn the_engine_takes_tls_and_a_user_and_says_which_one_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let Some(nats) = secure_nats(dir.path()) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let good = engine_config(&nats, dir.path(), "ca.pem", "password");
        let js = connect(&good, "test")
            .await
            .expect("the right CA and password");
        geogate::scale_out::engine::make_inputs(&js, 4)
            .await
            .expect("JetStream over TLS");

        let wrong_ca = engine_config(&nats, dir.path(), "other-ca.pem", "password");
        match connect(&wrong_ca, "test").await {
            Err(e @ EngineError::Tls { .. }) => assert!(e.to_string().contains("state.ca"), "{e}"),
            Err(other) => panic!("a wrong CA is a TLS error, not: {other}"),
            Ok(_) => panic!("a server certificate from another CA was trusted"),
        }

        let wrong_password = engine_config(&nats, dir.path(), "ca.pem", "wrong-password");
        match connect(&wrong_password, "test").await {
            Err(e @ EngineError::Credentials { .. }) => {
                let text = e.to_string();
                assert!(text.contains("state.password_file"), "{text}");
                assert!(!text.contains("guess"), "the password is not shown: {text}");
            }
            Err(other) => panic!("a wrong password is a credentials error, not: {other}"),
            Ok(_) => panic!("a wrong password was let in"),
        }
    });

    // The whole product over it: an instance joins the fleet.
    std::fs::write(dir.path().join("fences.geojson"), support::fleet::FENCES).unwrap();
    let d = dir.path().display();
    let mut geogate = GeogateProcess::prepare(
        dir.path(),
        &support::geogate::setup(0, "secure", ""),
        |default| {
            let metrics = default
                .lines()
                .find(|l| l.starts_with("listen = "))
                .unwrap()
                .to_owned();
            format!(
                "[mqtt]\nhost = \"127.0.0.1\"\nport = 1\nclient_id = \"secure\"\ntopics = [\"fleet/+/telemetry\"]\n[gate]\nkind = \"token\"\nrate = 100\nburst = 100\n\
             [fences]\npath = \"{d}/fences.geojson\"\n[dead_letter]\npath = \"{d}/dead-letter.ndjson\"\n\
             [state]\nbackend = \"partitioned\"\nurls = [\"{}\"]\npartitions = 4\nuser = \"geogate\"\npassword_file = \"{d}/password\"\nca = \"{d}/ca.pem\"\n\
             [metrics]\n{metrics}\n",
                nats.url()
            )
        },
    );
    geogate.restart_until("partition taken over");
    let (ok, _) = geogate.stop();
    assert!(ok);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(!log.contains(PASSWORD), "the password stays out of the log");
}

struct TlsRedis {
    port: u16,
    child: Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// redis-server on TLS only, the default user off and an ACL user on.
fn secure_redis(dir: &Path) -> Option<TlsRedis> {
    let binary = support::require(
        "redis-server (apt-get install redis-server)",
        support::binary("redis-server"),
    )?;
    let pki = new_pki("redis test CA");
    for _ in 0..5 {
        let port = support::free_port();
        let mut child = Command::new(&binary)
            .args(["--bind", "127.0.0.1", "--port", "0", "--save", ""])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", &write(dir, "redis.pem", &pki.server.0)])
            .args(["--tls-key-file", &write(dir, "redis.key", &pki.server.1)])
            .args(["--tls-ca-cert-file", &write(dir, "redis-ca.pem", &pki.ca)])
            .args(["--tls-auth-clients", "no"])
            .args(["--user", "default", "off"])
            .args([
                "--user",
                "geogate",
                "on",
                &format!(">{PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        if support::wait_for_child_port(&mut child, port) {
            return Some(TlsRedis { port, child });
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("redis-server could not bind a free port in 5 tries");
}

#[test]
fn the_shared_allowance_takes_rediss_and_an_acl_user_and_says_which_one_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let Some(redis) = secure_redis(dir.path()) else {
        return;
    };
    let ca = std::fs::read(dir.path().join("redis-ca.pem")).unwrap();
    let url = vec![format!("rediss://127.0.0.1:{}", redis.port)];
    let security = |ca: Vec<u8>, password: &str| RedisSecurity {
        ca: Some(ca),
        user: Some("geogate".into()),
        password: Some(password.into()),
    };
    let timeout = Duration::from_secs(3);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut link = RedisLink::connect(&url, false, timeout, &security(ca.clone(), PASSWORD))
            .await
            .expect("the right CA and password");
        let pong: String = redis::cmd("PING").query_async(&mut link).await.unwrap();
        assert_eq!(pong, "PONG");

        let other_ca = new_pki("another CA").ca.into_bytes();
        let e = RedisLink::connect(&url, false, timeout, &security(other_ca, PASSWORD))
            .await
            .err()
            .expect("a server certificate from another CA is not trusted");
        assert_eq!(e.kind, RedisProblem::Tls, "{e}");

        let e = RedisLink::connect(&url, false, timeout, &security(ca.clone(), "guess"))
            .await
            .err()
            .expect("a wrong password is refused");
        assert_eq!(e.kind, RedisProblem::Credentials, "{e}");
        assert!(!e.to_string().contains("guess"), "{e}");

        let plain = vec![format!("redis://127.0.0.1:{}", redis.port)];
        let e = RedisLink::connect(&plain, false, timeout, &security(ca, PASSWORD))
            .await
            .err()
            .expect("plain text to a TLS port fails");
        assert_ne!(e.kind, RedisProblem::Credentials, "{e}");
    });
}

/// The README's device user: it may publish fixes over MQTT, and nothing
/// else. The server checks a publish after its mapping, so the rights name
/// the partitions' subjects; a device publishing to a partition's commit
/// log or to the JetStream API is refused.
#[test]
fn a_device_can_publish_fixes_and_nothing_else() {
    let Some(mosquitto_pub) = support::require(
        "mosquitto_pub (apt-get install mosquitto-clients)",
        support::binary("mosquitto_pub"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let users = format!(
        "authorization {{ users = [\n  {{ user: geogate, password: \"{PASSWORD}\" }}\n  {{ user: device, password: \"device-pass\", permissions: {{ publish: {{ allow: [\"in.*.fleet.*.telemetry\", \"in.*.owntracks.*.*\", \"$MQTT.>\"] }}, subscribe: {{ allow: [\"$MQTT.>\"] }} }} }}\n] }}\n"
    );
    let Some(nats) = Nats::start_partitioned_with(4, &users) else {
        return;
    };
    write(dir.path(), "password", PASSWORD);
    let config = PartitionedConfig {
        urls: vec![nats.url()],
        partitions: 4,
        user: Some("geogate".into()),
        password_file: Some(dir.path().join("password")),
        ..PartitionedConfig::default()
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let js = runtime.block_on(async {
        let js = connect(&config, "test").await.expect("geogate's user");
        geogate::scale_out::engine::make_inputs(&js, 4)
            .await
            .unwrap();
        geogate::jetstream_link::file_stream(&js, "GEOGATE_STATE_0".into(), "state.0".into())
            .await
            .unwrap();
        js
    });
    let publish = |topic: &str, payload: &str| {
        Command::new(&mosquitto_pub)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &nats.mqtt_port.unwrap().to_string(),
            ])
            .args([
                "-u",
                "device",
                "-P",
                "device-pass",
                "-q",
                "1",
                "-t",
                topic,
                "-m",
                payload,
            ])
            .status()
            .expect("mosquitto_pub")
    };
    assert!(
        publish(
            "fleet/van7/telemetry",
            r#"{"ts":1750000000000,"lat":50,"lon":10}"#
        )
        .success()
    );
    publish("state/0", "forged commit");
    publish("$JS/API/STREAM/DELETE/GEOGATE_IN_0", "");
    runtime.block_on(async {
        let messages = |name: &'static str| {
            let js = js.clone();
            async move {
                let mut stream = js.get_stream(name).await.expect(name);
                stream.info().await.unwrap().state.messages
            }
        };
        let mut inputs = 0;
        for p in 0..4 {
            let name: &'static str = [
                "GEOGATE_IN_0",
                "GEOGATE_IN_1",
                "GEOGATE_IN_2",
                "GEOGATE_IN_3",
            ][p];
            inputs += messages(name).await;
        }
        assert_eq!(
            inputs, 1,
            "the fix is in its partition, and the input streams are all there"
        );
        assert_eq!(
            messages("GEOGATE_STATE_0").await,
            0,
            "nothing forged in a commit log"
        );
    });
}
