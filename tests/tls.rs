//! MQTT over TLS with a password file, against a real mosquitto and
//! certificates generated at test time: the right credentials get through,
//! a wrong password and an untrusted certificate are refused with a clear
//! error, and the password never reaches the logs.

mod support;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;
use support::geogate::{GeogateProcess, Setup, read_ndjson};
use support::pki::{Pki, new_pki, pki_for, write};

struct TlsBroker {
    port: u16,
    child: Child,
}

impl Drop for TlsBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_broker(dir: &Path, pki: &Pki) -> Option<TlsBroker> {
    let mosquitto = support::require("mosquitto", support::binary("mosquitto"))?;
    let passwd_tool = support::require(
        "mosquitto_passwd (mosquitto package)",
        support::binary("mosquitto_passwd"),
    )?;
    let passwd = dir.join("passwd");
    let ok = Command::new(passwd_tool)
        .args(["-b", "-c"])
        .arg(&passwd)
        .args(["geogate", "s3cret-pa55"])
        .status()
        .unwrap();
    assert!(ok.success());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for f in std::fs::read_dir(dir).unwrap() {
            let _ =
                std::fs::set_permissions(f.unwrap().path(), std::fs::Permissions::from_mode(0o644));
        }
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    }
    let port = support::free_port();
    let conf = format!(
        "listener {port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n\
         allow_anonymous false\npassword_file {}\nlog_type error\n",
        write(dir, "ca.pem", &pki.ca),
        write(dir, "server.pem", &pki.server.0),
        write(dir, "server.key", &pki.server.1),
        passwd.display()
    );
    let conf = write(dir, "mosquitto.conf", &conf);
    let child = Command::new(mosquitto).args(["-c", &conf]).spawn().unwrap();
    support::wait_for_port(port);
    Some(TlsBroker { port, child })
}

fn tls_section(dir: &Path, pki: &Pki, password: &str) -> String {
    format!(
        "username = \"geogate\"\npassword = \"{password}\"\n[mqtt.tls]\nca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"",
        write(dir, "client-ca.pem", &pki.ca),
        write(dir, "client.pem", &pki.client.0),
        write(dir, "client.key", &pki.client.1)
    )
}

const UNKNOWN_CA: &str = "(unknown CA)";
const HOST_MISMATCH: &str = "(host name mismatch)";
const CLIENT_CERT_REFUSED: &str = "refused geogate's client certificate";

/// Two connects refused for `reason`, none for another TLS reason, and no
/// connection: each failure is told apart from the others.
fn refused_only_for(geogate: &GeogateProcess, reason: &str) {
    geogate.wait_for_log(reason, 2);
    let log = std::fs::read_to_string(geogate.dir.join("stderr.log")).unwrap();
    assert!(!log.contains("connected to broker"), "{log}");
    for other in [UNKNOWN_CA, HOST_MISMATCH, CLIENT_CERT_REFUSED] {
        assert!(other == reason || !log.contains(other), "{other} in {log}");
    }
}

fn setup<'a>(port: u16, extra: &'a str, id: &'a str) -> Setup<'a> {
    Setup {
        broker_port: port,
        embedded: false,
        client_id: id,
        extra_pipeline: "",
        gate: "kind = \"token\"\nrate = 100\nburst = 100",
        events_mqtt: false,
        extra_mqtt: extra,
    }
}

#[test]
fn tls_with_password_and_client_certificate() {
    let certs = tempfile::tempdir().unwrap();
    let pki = new_pki("geogate test CA");
    let Some(broker) = start_broker(certs.path(), &pki) else {
        return;
    };

    // The right CA, certificate and password: connected, and a fix
    // published over TLS is evaluated.
    let dir = tempfile::tempdir().unwrap();
    let extra = tls_section(dir.path(), &pki, "s3cret-pa55");
    let geogate = GeogateProcess::start(dir.path(), &setup(broker.port, &extra, "tls-ok"));
    let Some(pub_tool) = support::binary("mosquitto_pub") else {
        panic!("mosquitto_pub is needed next to mosquitto (package mosquitto-clients)");
    };
    let status = Command::new(pub_tool)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &broker.port.to_string(),
            "-q",
            "1",
            "-u",
            "geogate",
            "-P",
            "s3cret-pa55",
        ])
        .args(["--cafile", &format!("{}/ca.pem", certs.path().display())])
        .args([
            "--cert",
            &format!("{}/client.pem", dir.path().display()),
            "--key",
            &format!("{}/client.key", dir.path().display()),
        ])
        .args([
            "-t",
            "fleet/t1/telemetry",
            "-m",
            r#"{"vehicle":"t1","ts":1750000000000,"lat":50.005,"lon":10.005,"speed_kmh":20}"#,
        ])
        .status()
        .unwrap();
    assert!(status.success(), "mosquitto_pub over TLS");
    geogate.wait_processed(1.0, 20);
    let (ok, _) = geogate.terminate();
    assert!(ok);
    assert_eq!(read_ndjson(&dir.path().join("events.ndjson")).len(), 1);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(
        !log.contains("s3cret-pa55"),
        "the password never reaches the log"
    );

    // A wrong password: refused, with an error that says what to check.
    let dir = tempfile::tempdir().unwrap();
    let extra = tls_section(dir.path(), &pki, "wrong-password");
    let refused = GeogateProcess::launch(dir.path(), &setup(broker.port, &extra, "tls-badpass"));
    refused.wait_for_log(
        "the broker refused the connection: check mqtt.username / mqtt.password",
        1,
    );
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(
        !log.contains("connected to broker") && !log.contains("wrong-password"),
        "{log}"
    );
    drop(refused);

    // A broker certificate from a CA geogate does not trust: refused at the
    // TLS handshake, with an error that says so.
    let dir = tempfile::tempdir().unwrap();
    let stranger = new_pki("some other CA");
    let mut extra = tls_section(dir.path(), &pki, "s3cret-pa55");
    extra = extra.replace(
        &format!("{}/client-ca.pem", dir.path().display()),
        &write(dir.path(), "stranger-ca.pem", &stranger.ca),
    );
    let untrusted =
        GeogateProcess::launch(dir.path(), &setup(broker.port, &extra, "tls-untrusted"));
    refused_only_for(&untrusted, UNKNOWN_CA);
    drop(untrusted);

    // No client certificate, where the broker requires one.
    let dir = tempfile::tempdir().unwrap();
    let without_client_cert = tls_section(dir.path(), &pki, "s3cret-pa55")
        .lines()
        .filter(|l| !l.starts_with("client_"))
        .collect::<Vec<_>>()
        .join("\n");
    let refused = GeogateProcess::launch(
        dir.path(),
        &setup(broker.port, &without_client_cert, "tls-no-client-cert"),
    );
    refused_only_for(&refused, CLIENT_CERT_REFUSED);
}

/// A broker whose certificate names another host: told apart from an
/// unknown CA and from a refused client certificate.
#[test]
fn a_certificate_for_another_host_is_named_as_such() {
    let certs = tempfile::tempdir().unwrap();
    let pki = pki_for("geogate name CA", &["broker.example"]);
    let Some(broker) = start_broker(certs.path(), &pki) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let extra = tls_section(dir.path(), &pki, "s3cret-pa55");
    let mismatch = GeogateProcess::launch(dir.path(), &setup(broker.port, &extra, "tls-name"));
    refused_only_for(&mismatch, HOST_MISMATCH);
}

/// TLS over a link with 150 ms each way (300 ms round trip): the handshake
/// alone takes several round trips, and the connect must not be cut short
/// (geogate used to give `poll` 100 ms and start again from zero, forever).
#[test]
fn tls_connects_and_evaluates_over_a_300_ms_round_trip() {
    let certs = tempfile::tempdir().unwrap();
    let pki = new_pki("geogate slow-link CA");
    let Some(broker) = start_broker(certs.path(), &pki) else {
        return;
    };
    let proxy = support::proxy::Proxy::start(broker.port, Duration::from_millis(150));
    let dir = tempfile::tempdir().unwrap();
    let extra = tls_section(dir.path(), &pki, "s3cret-pa55");
    let geogate = GeogateProcess::start(dir.path(), &setup(proxy.port, &extra, "tls-slow"));
    // Ten fixes of one vehicle, alternating between fences A and B.
    let lines: String = (0..10)
        .map(|k| {
            format!(
                "{{\"vehicle\":\"t2\",\"ts\":{},\"lat\":50.005,\"lon\":{},\"speed_kmh\":20}}\n",
                1_750_000_000_000i64 + 1000 * k,
                if k % 2 == 0 { 10.005 } else { 10.025 }
            )
        })
        .collect();
    let Some(pub_tool) = support::binary("mosquitto_pub") else {
        panic!("mosquitto_pub is needed next to mosquitto (package mosquitto-clients)");
    };
    let mut child = Command::new(pub_tool)
        .args(["-h", "127.0.0.1", "-p", &broker.port.to_string(), "-q", "1"])
        .args(["-u", "geogate", "-P", "s3cret-pa55"])
        .args(["--cafile", &format!("{}/ca.pem", certs.path().display())])
        .args([
            "--cert",
            &format!("{}/client.pem", dir.path().display()),
            "--key",
            &format!("{}/client.key", dir.path().display()),
        ])
        .args(["-t", "fleet/t2/telemetry", "-l"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(lines.as_bytes())
            .unwrap();
    }
    assert!(child.wait().unwrap().success(), "mosquitto_pub over TLS");
    geogate.wait_processed(10.0, 30);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert_eq!(log.matches("connected to broker").count(), 1, "{log}");
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");
    let enters = read_ndjson(&dir.path().join("events.ndjson"))
        .iter()
        .filter(|e| e["event"] == "enter")
        .count();
    assert_eq!(enters, 10);
}
