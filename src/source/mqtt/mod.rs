//! MQTT intake (rumqttc) with at-least-once delivery end to end.
//!
//! **Acks.** The session is persistent (`clean_session = false`, a stable
//! client id) and acks are manual. Every QoS 1 message gets a token in
//! receive order and is registered with the [`acker`], together with the
//! connection it arrived on, before it enters the pipeline. A message is
//! finished once it is evaluated, or durably written to the dead letter.
//! The acker acks the finished prefix in receive order, and only on the
//! message's own connection (see [`acker`] for why), so a crash leaves
//! every unfinished message unacked (with, at most, finished ones queued
//! behind them) and the broker redelivers them.
//!
//! **Backpressure without deadlock.** The poll task is the only task that
//! drives the connection, so it must never wait on something that waits on
//! it. It forwards each publish into a bounded intake channel; when that is
//! full it waits, which stops reading the socket, so TCP and the broker's
//! inflight window (unacked messages) push back on the publishers. Nothing
//! downstream of intake needs the poll task to make progress: workers finish
//! without it, and acks queue in the client's request channel until polling
//! resumes (the acker waits for room there; the poll task never waits on
//! the acker). Outgoing transitions use a
//! separate connection for the same reason.
//!
//! **Connecting and reconnecting** are in [`poll`].

pub mod acker;
pub mod config;
pub mod metrics;
pub mod poll;

pub use acker::{AckCounts, Acker, ConnectionId, LiveConnection, Registration};
pub use poll::{IntakeControl, Phase, poll_loop};

use config::MqttConfig;
use rumqttc::{MqttOptions, QoS};
use std::time::Duration;

/// Connection settings shared by the intake and output connections: host,
/// keep-alive, packet cap, credentials and TLS.
pub fn connection(config: &MqttConfig, client_id: &str) -> std::io::Result<MqttOptions> {
    let mut options = MqttOptions::new(client_id, &config.host, config.port);
    options
        .set_keep_alive(Duration::from_secs(config.keep_alive_s.max(5)))
        .set_max_packet_size(config.max_packet_bytes, config.max_packet_bytes);
    if let Some(user) = &config.username {
        options.set_credentials(user, config.password.clone().unwrap_or_default());
    }
    if let Some(tls) = &config.tls {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        };
        let client_auth = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        options.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Simple {
                ca: read(&tls.ca_file)?,
                alpn: None,
                client_auth,
            },
        ));
    }
    Ok(options)
}

/// The subscription filters for `mqtt.topics` at `mqtt.subscribe_qos`
/// (validated to 0 or 1).
pub fn subscribe_filters(mqtt: &MqttConfig) -> Vec<rumqttc::SubscribeFilter> {
    let qos = if mqtt.subscribe_qos == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    };
    mqtt.topics
        .iter()
        .map(|t| rumqttc::SubscribeFilter::new(t.clone(), qos))
        .collect()
}

/// Intake options: persistent session, manual acks, inflight window.
pub fn options(config: &MqttConfig, client_id: &str) -> std::io::Result<MqttOptions> {
    let mut options = connection(config, client_id)?;
    options
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_inflight(u16::try_from(config.max_unacked.min(u16::MAX as usize)).unwrap_or(u16::MAX));
    Ok(options)
}

/// Says what an operator should check for the errors that need a human.
pub(crate) fn explain(e: &rumqttc::ConnectionError) -> Option<&'static str> {
    match e {
        rumqttc::ConnectionError::ConnectionRefused(_) => Some(
            "the broker refused the connection: check mqtt.username / mqtt.password and the broker's ACL",
        ),
        _ => rustls_in_chain(e)
            .map(explain_tls)
            .or(matches!(e, rumqttc::ConnectionError::Tls(_)).then_some(TLS_IN_GENERAL)),
    }
}

const TLS_IN_GENERAL: &str = "TLS failed: check mqtt.tls.ca_file signs the broker's certificate, its name matches mqtt.host, and any client certificate";

/// The rustls error somewhere in the error's chain. tokio-rustls wraps it
/// in an I/O error, and a refused client certificate arrives only with the
/// first read after the handshake (TLS 1.3), so rumqttc reports it as a
/// failed CONNACK read, several layers down.
fn rustls_in_chain<'e>(
    e: &'e (dyn std::error::Error + 'static),
) -> Option<&'e rumqttc::tokio_rustls::rustls::Error> {
    use rumqttc::tokio_rustls::rustls::Error;
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<Error>() {
            return Some(found);
        }
        if let Some(found) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<Error>())
        {
            return Some(found);
        }
        next = err.source();
    }
    None
}

/// Tells the TLS failures apart: each needs a different fix.
fn explain_tls(e: &rumqttc::tokio_rustls::rustls::Error) -> &'static str {
    use rumqttc::tokio_rustls::rustls::{AlertDescription, CertificateError, Error};
    match e {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "TLS: the broker's certificate is not signed by a CA in mqtt.tls.ca_file (unknown CA)",
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            "TLS: the broker's certificate does not name mqtt.host (host name mismatch): connect by a name the certificate lists"
        }
        Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "TLS: the broker's certificate is expired or not yet valid",
        Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown,
        ) => {
            "TLS: the broker refused geogate's client certificate: set mqtt.tls.client_cert_file and client_key_file to a pair its CA signed"
        }
        _ => TLS_IN_GENERAL,
    }
}

/// Socket settings for every connection: the whole connect (TCP, TLS,
/// CONNECT/CONNACK) gets `connect_timeout_s`.
pub fn network_options(config: &MqttConfig) -> rumqttc::NetworkOptions {
    let mut network = rumqttc::NetworkOptions::new();
    network.set_connection_timeout(config.connect_timeout_s.max(1));
    network
}

/// `host:port`, for log lines.
pub fn broker_address(config: &MqttConfig) -> String {
    format!("{}:{}", config.host, config.port)
}
