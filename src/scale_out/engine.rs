//! The connection to the engine (NATS JetStream), and what every instance
//! checks there before it owns anything: the partition count the fleet was
//! started with, and an input stream for every partition.

use crate::jetstream_link::file_stream;
use crate::source::jetstream::{stream_name, subjects};
use crate::state::partitioned::config::PartitionedConfig;
use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use async_nats::{ConnectErrorKind, ConnectOptions};
use bytes::Bytes;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "NATS at {urls}: the server refused the credentials (state.user, state.password_file): {detail}"
    )]
    Credentials { urls: String, detail: String },
    #[error(
        "NATS at {urls}: TLS failed (state.ca, state.cert, state.key; a server certificate not signed by state.ca, or a server without TLS): {detail}"
    )]
    Tls { urls: String, detail: String },
    #[error("NATS at {urls}: cannot connect: {detail}")]
    Unreachable { urls: String, detail: String },
    #[error("state.password_file {path}: {detail}")]
    PasswordFile { path: String, detail: String },
    #[error(
        "the fleet in this engine was started with {recorded} partitions, and this instance has state.partitions = {configured}: a vehicle's partition is a hash of its id modulo the count, so instances with another count would read other vehicles' fixes; use {recorded} (changing the count needs a new fleet in the engine, see decision 0025)"
    )]
    PartitionCount { recorded: u32, configured: u32 },
    #[error("NATS JetStream: {0}")]
    JetStream(String),
}

/// Connects with the configured credentials and TLS, naming the
/// connection after the instance. A wrong CA, a wrong password and an
/// unreachable server each get their own error.
pub async fn connect(
    config: &PartitionedConfig,
    instance: &str,
) -> Result<jetstream::Context, EngineError> {
    let urls = config.urls.join(",");
    let timeout = Duration::from_millis(config.timeout_ms);
    let mut options = ConnectOptions::new()
        .name(instance)
        .connection_timeout(timeout)
        .request_timeout(Some(timeout))
        // Reconnects forever: a restarted server is waited for.
        .max_reconnects(None);
    if let (Some(user), Some(path)) = (&config.user, &config.password_file) {
        let password = std::fs::read_to_string(path).map_err(|e| EngineError::PasswordFile {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        options = options.user_and_password(user.clone(), password.trim_end().to_owned());
    }
    if let Some(ca) = &config.ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&config.cert, &config.key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    let client = options.connect(config.urls.as_slice()).await.map_err(|e| {
        let detail = e.to_string();
        let urls = urls.clone();
        // A certificate refused in the handshake comes back as an I/O
        // error: its text tells it apart.
        let lower = detail.to_ascii_lowercase();
        match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                EngineError::Credentials { urls, detail }
            }
            ConnectErrorKind::Tls => EngineError::Tls { urls, detail },
            _ if lower.contains("certificate") || lower.contains("tls") => {
                EngineError::Tls { urls, detail }
            }
            _ => EngineError::Unreachable { urls, detail },
        }
    })?;
    let mut js = jetstream::new(client);
    js.set_timeout(timeout);
    Ok(js)
}

const META_STREAM: &str = "GEOGATE_META";
const PARTITIONS_SUBJECT: &str = "meta.partitions";

/// Records the partition count on the fleet's first start, and refuses an
/// instance configured with another.
pub async fn check_partition_count(
    js: &jetstream::Context,
    configured: u32,
) -> Result<(), EngineError> {
    let jet = |e: String| EngineError::JetStream(e);
    let meta = js
        .get_or_create_stream(stream::Config {
            name: META_STREAM.into(),
            subjects: vec!["meta.>".into()],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| jet(e.to_string()))?;
    let recorded = match meta
        .get_last_raw_message_by_subject(PARTITIONS_SUBJECT)
        .await
    {
        Ok(m) => Some(m.payload),
        Err(_) => {
            let publish = jetstream::message::PublishMessage::build()
                .payload(Bytes::from(configured.to_string()))
                .expected_last_subject_sequence(0);
            match js.send_publish(PARTITIONS_SUBJECT, publish).await {
                Ok(ack) => match ack.await {
                    Ok(_) => None,
                    // Another instance recorded it first: read theirs.
                    Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Some(
                        meta.get_last_raw_message_by_subject(PARTITIONS_SUBJECT)
                            .await
                            .map_err(|e| jet(e.to_string()))?
                            .payload,
                    ),
                    Err(e) => return Err(jet(e.to_string())),
                },
                Err(e) => return Err(jet(e.to_string())),
            }
        }
    };
    if let Some(recorded) = recorded {
        let recorded: u32 = std::str::from_utf8(&recorded)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                jet(format!(
                    "{PARTITIONS_SUBJECT} holds {recorded:?}, not a count"
                ))
            })?;
        if recorded != configured {
            return Err(EngineError::PartitionCount {
                recorded,
                configured,
            });
        }
    }
    Ok(())
}

/// Makes every partition's input stream that does not exist yet: the
/// server keeps a device's publish only once its stream exists.
pub async fn make_inputs(js: &jetstream::Context, partitions: u32) -> Result<(), EngineError> {
    for p in 0..partitions {
        file_stream(js, stream_name(p), subjects(p))
            .await
            .map_err(EngineError::JetStream)?;
    }
    Ok(())
}
