//! Topic patterns that name the vehicle, e.g. `fleet/{vehicle}/telemetry`
//! or `owntracks/{user}/{device}` (the segments are joined with `/`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopicPattern {
    raw: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// A `{name}` placeholder; every placeholder's value is part of the id.
    Capture,
}

impl TryFrom<String> for TopicPattern {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, Self::Error> {
        let segments: Vec<Segment> = raw
            .split('/')
            .map(|s| {
                if s.starts_with('{') && s.ends_with('}') && s.len() > 2 {
                    Segment::Capture
                } else {
                    Segment::Literal(s.to_owned())
                }
            })
            .collect();
        if !segments.contains(&Segment::Capture) {
            return Err(format!(
                "topic pattern {raw:?} has no {{placeholder}} to name the vehicle"
            ));
        }
        Ok(Self { raw, segments })
    }
}

impl From<TopicPattern> for String {
    fn from(p: TopicPattern) -> String {
        p.raw
    }
}

impl TopicPattern {
    /// Whether the pattern has a `{vehicle}` placeholder: only such a topic
    /// may stand in for a native payload's missing `vehicle` (an OwnTracks
    /// `{user}/{device}` topic names a phone, not a fleet id).
    pub fn names_vehicle(&self) -> bool {
        self.raw.contains("{vehicle}")
    }

    /// The vehicle id the topic names, or `None` when it does not match.
    pub fn vehicle<'t>(&self, topic: &'t str) -> Option<String> {
        let mut parts = topic.split('/');
        let mut captured: Vec<&'t str> = Vec::new();
        for segment in &self.segments {
            let part = parts.next()?;
            match segment {
                Segment::Literal(lit) if lit == part => {}
                Segment::Literal(_) => return None,
                Segment::Capture if part.is_empty() => return None,
                Segment::Capture => captured.push(part),
            }
        }
        parts.next().is_none().then(|| captured.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_join_and_mismatches_are_none() {
        let ot = TopicPattern::try_from("owntracks/{user}/{device}".to_owned()).unwrap();
        assert_eq!(
            ot.vehicle("owntracks/ann/phone").as_deref(),
            Some("ann/phone")
        );
        assert_eq!(ot.vehicle("owntracks/ann"), None);
        assert_eq!(ot.vehicle("owntracks/ann/phone/extra"), None);
        assert_eq!(ot.vehicle("owntracks//phone"), None);
        let fleet = TopicPattern::try_from("fleet/{vehicle}/telemetry".to_owned()).unwrap();
        assert_eq!(fleet.vehicle("fleet/v17/telemetry").as_deref(), Some("v17"));
        assert_eq!(fleet.vehicle("fleet/v17/status"), None);
        assert!(TopicPattern::try_from("fleet/all".to_owned()).is_err());
    }
}
