//! The two things every user of NATS JetStream here does the same way
//! (decision 0025): keep a stream on disk for one subject pattern, and read
//! a stream in order from a position without acks (the position is the
//! reader's to keep, in its own commits).

use async_nats::jetstream::{self, consumer, stream};

/// The stream `name` holding `subject`, made on disk if it is new.
pub async fn file_stream(
    js: &jetstream::Context,
    name: String,
    subject: String,
) -> Result<stream::Stream, String> {
    js.get_or_create_stream(stream::Config {
        name,
        subjects: vec![subject],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())
}

/// A reader of `stream` from the message after sequence `after`, in
/// order, with no acks.
pub async fn reader_after(
    stream: &stream::Stream,
    after: u64,
) -> Result<consumer::Consumer<consumer::pull::Config>, String> {
    subject_reader_after(stream, String::new(), after).await
}

/// The same, of the messages on `subject` only (every subject when empty).
pub async fn subject_reader_after(
    stream: &stream::Stream,
    subject: String,
    after: u64,
) -> Result<consumer::Consumer<consumer::pull::Config>, String> {
    stream
        .create_consumer(consumer::pull::Config {
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
            ack_policy: consumer::AckPolicy::None,
            filter_subject: subject,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())
}
