//! The metrics of the MQTT intake: each name written once, here, with its
//! description; the code records through these constants.

use metrics::{Unit, describe_counter, describe_gauge};

pub const MQTT_CONNECTED: &str = "geogate_mqtt_connected";
pub const MQTT_RECONNECTS_TOTAL: &str = "geogate_mqtt_reconnects_total";
pub const MQTT_UNACKED: &str = "geogate_mqtt_unacked";
pub const MQTT_SUBSCRIBED: &str = "geogate_mqtt_subscribed";
pub const MQTT_ACKS_TOTAL: &str = "geogate_mqtt_acks_total";
pub const MQTT_LEFT_FOR_REDELIVERY_TOTAL: &str = "geogate_mqtt_left_for_redelivery_total";

/// Describes them to the exporter.
pub fn describe() {
    describe_gauge!(
        MQTT_CONNECTED,
        Unit::Count,
        "1 while the intake connection is up."
    );
    describe_counter!(
        MQTT_RECONNECTS_TOTAL,
        Unit::Count,
        "Intake connection errors followed by a reconnect."
    );
    describe_gauge!(
        MQTT_UNACKED,
        Unit::Count,
        "QoS 1 messages received and not yet acked."
    );
    describe_gauge!(
        MQTT_SUBSCRIBED,
        Unit::Count,
        "1 once a SUBACK has confirmed every filter on the current connection."
    );
    describe_counter!(
        MQTT_ACKS_TOTAL,
        Unit::Count,
        "Finished QoS 1 messages by outcome: acked on their own connection, or withheld (their connection is gone, or a later copy with the same packet id carries the ack)."
    );
    describe_counter!(
        MQTT_LEFT_FOR_REDELIVERY_TOTAL,
        Unit::Count,
        "Messages left unacked during shutdown for the broker to redeliver."
    );
}
