//! Topic patterns that name the vehicle, e.g. `fleet/{vehicle}/telemetry`
//! or `owntracks/{user}/{device}` (the segments are joined with `/`).

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopicPattern {
    raw: String,
    segments: Vec<Segment>,
    /// The captures are one run of segments (as in both built-in
    /// patterns), so the id is a stretch of the topic and can be borrowed.
    captures_adjacent: bool,
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
        let captures = segments.iter().filter(|s| **s == Segment::Capture).count();
        let first = segments.iter().position(|s| *s == Segment::Capture);
        let last = segments.iter().rposition(|s| *s == Segment::Capture);
        let captures_adjacent =
            matches!((first, last), (Some(f), Some(l)) if l - f + 1 == captures);
        Ok(Self {
            raw,
            segments,
            captures_adjacent,
        })
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
    /// Borrowed when the captures are adjacent, so that an OwnTracks fix
    /// with an id of up to 23 bytes is decoded without an allocation.
    pub fn vehicle<'t>(&self, topic: &'t str) -> Option<Cow<'t, str>> {
        let mut parts = topic.split('/');
        let mut at = 0;
        let mut span: Option<(usize, usize)> = None;
        for segment in &self.segments {
            let part = parts.next()?;
            match segment {
                Segment::Literal(lit) if lit == part => {}
                Segment::Literal(_) => return None,
                Segment::Capture if part.is_empty() => return None,
                Segment::Capture => {
                    span = Some((span.map_or(at, |(first, _)| first), at + part.len()));
                }
            }
            at += part.len() + 1;
        }
        if parts.next().is_some() {
            return None;
        }
        let (first, last) = span?;
        if self.captures_adjacent {
            return Some(Cow::Borrowed(&topic[first..last]));
        }
        let captured: Vec<&str> = topic
            .split('/')
            .zip(&self.segments)
            .filter(|(_, segment)| **segment == Segment::Capture)
            .map(|(part, _)| part)
            .collect();
        Some(Cow::Owned(captured.join("/")))
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
        // Captures apart in the topic are joined; adjacent ones are the
        // topic's own stretch.
        let apart = TopicPattern::try_from("{site}/gps/{unit}".to_owned()).unwrap();
        assert_eq!(apart.vehicle("depot/gps/u9").as_deref(), Some("depot/u9"));
        assert!(matches!(
            ot.vehicle("owntracks/ann/phone"),
            Some(Cow::Borrowed(_))
        ));
        assert_eq!(apart.vehicle("depot/gps/"), None);
        // Whether the id can be borrowed is the pattern's: adjacent
        // captures anywhere in it, and only those.
        let tail = TopicPattern::try_from("x/{a}/{b}".to_owned()).unwrap();
        assert!(matches!(tail.vehicle("x/p/q"), Some(Cow::Borrowed("p/q"))));
        assert!(matches!(apart.vehicle("depot/gps/u9"), Some(Cow::Owned(_))));
    }

    /// The pattern's reading, written the plain way: split, match, join.
    fn joined(pattern: &TopicPattern, topic: &str) -> Option<String> {
        let parts: Vec<&str> = topic.split('/').collect();
        if parts.len() != pattern.segments.len() {
            return None;
        }
        let mut captured = Vec::new();
        for (segment, part) in pattern.segments.iter().zip(parts) {
            match segment {
                Segment::Literal(lit) if lit == part => {}
                Segment::Capture if !part.is_empty() => captured.push(part),
                _ => return None,
            }
        }
        Some(captured.join("/"))
    }

    proptest::proptest! {
        /// Topics built from the pattern (captures filled with 1–3
        /// characters, some multi-byte), then left alone or broken: one
        /// segment short, one too many, or an empty capture.
        #[test]
        fn reads_a_topic_as_split_match_join_does(
            pattern in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "", "{x}"]), 1..5),
            fills in proptest::collection::vec("[a-cé]{1,3}", 5),
            mutation in 0u8..4,
        ) {
            let mut segments: Vec<&str> = pattern;
            if !segments.contains(&"{x}") {
                segments.push("{x}");
            }
            let pattern = TopicPattern::try_from(segments.join("/")).unwrap();
            let mut parts: Vec<&str> = segments
                .iter()
                .zip(&fills)
                .map(|(segment, fill)| if *segment == "{x}" { fill.as_str() } else { segment })
                .collect();
            match mutation {
                1 => {
                    parts.pop();
                }
                2 => parts.push("c"),
                3 => {
                    let first = segments.iter().position(|s| *s == "{x}").unwrap();
                    parts[first] = "";
                }
                _ => {}
            }
            let topic = parts.join("/");
            proptest::prop_assert_eq!(pattern.vehicle(&topic).map(Cow::into_owned), joined(&pattern, &topic));
        }
    }
}
