//! Gate settings as operators write them: in TOML
//! (`kind = "token"`, `rate = 32000`, `burst = 24000`) or on the command line
//! (`token:rate=32000,burst=24000`).

use super::{AnyGate, FixedWindow, LeakyMeter, LeakyShaper, Rate, TokenBucket};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum GateSpecError {
    #[error("rate: {0}")]
    Rate(String),
    #[error("burst: {0}")]
    Burst(String),
    #[error("gate spec: {0}")]
    Syntax(String),
}

/// Which gate a shard runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    Token,
    LeakyMeter,
    LeakyShaper,
    /// Lab only: refused by the pipeline config.
    FixedWindow,
}

impl GateKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            GateKind::Token => "token",
            GateKind::LeakyMeter => "leaky_meter",
            GateKind::LeakyShaper => "leaky_shaper",
            GateKind::FixedWindow => "fixed_window",
        }
    }
}

/// A gate's kind, sustained rate (per second) and burst (token capacity,
/// meter size or shaper queue depth, in cost units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSpec {
    pub kind: GateKind,
    pub rate: f64,
    pub burst: u32,
}

impl GateSpec {
    /// Checks the numbers, then builds the gate. A fixed window uses `burst`
    /// as its per-second limit, ignoring `rate` beyond validation.
    pub fn build(&self) -> Result<AnyGate, GateSpecError> {
        let rate = Rate::per_second(self.rate)?;
        Ok(match self.kind {
            GateKind::Token => AnyGate::Token(TokenBucket::new(rate, self.burst)?),
            GateKind::LeakyMeter => AnyGate::LeakyMeter(LeakyMeter::new(rate, self.burst)?),
            GateKind::LeakyShaper => AnyGate::LeakyShaper(LeakyShaper::new(rate, self.burst)?),
            GateKind::FixedWindow => {
                AnyGate::FixedWindow(FixedWindow::new(self.burst, crate::clock::NANOS_PER_SEC)?)
            }
        })
    }

    /// A label for reports: `token:rate=32000,burst=24000`.
    pub fn label(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for GateSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:rate={},burst={}",
            self.kind.as_str(),
            self.rate,
            self.burst
        )
    }
}

impl FromStr for GateSpec {
    type Err = GateSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, params) = s.split_once(':').ok_or_else(|| {
            GateSpecError::Syntax(format!(
                "expected KIND:rate=R,burst=B (e.g. token:rate=100,burst=20), got {s:?}"
            ))
        })?;
        let kind = match kind.trim() {
            "token" => GateKind::Token,
            "leaky_meter" => GateKind::LeakyMeter,
            "leaky_shaper" => GateKind::LeakyShaper,
            "fixed_window" => GateKind::FixedWindow,
            other => {
                return Err(GateSpecError::Syntax(format!(
                    "unknown gate kind {other:?}; expected token, leaky_meter, leaky_shaper or fixed_window"
                )));
            }
        };
        let (mut rate, mut burst) = (None, None);
        for pair in params.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                GateSpecError::Syntax(format!("expected key=value, got {pair:?}"))
            })?;
            match key.trim() {
                "rate" => {
                    rate = Some(value.trim().parse::<f64>().map_err(|e| {
                        GateSpecError::Rate(format!("{value:?} is not a number: {e}"))
                    })?)
                }
                "burst" => {
                    burst = Some(value.trim().parse::<u32>().map_err(|e| {
                        GateSpecError::Burst(format!("{value:?} is not a whole number: {e}"))
                    })?)
                }
                other => {
                    return Err(GateSpecError::Syntax(format!(
                        "unknown key {other:?}; expected rate or burst"
                    )));
                }
            }
        }
        let spec = GateSpec {
            kind,
            rate: rate.ok_or_else(|| GateSpecError::Rate("missing rate=".into()))?,
            burst: burst.ok_or_else(|| GateSpecError::Burst("missing burst=".into()))?,
        };
        spec.build()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        let spec: GateSpec = "token:rate=32000,burst=24000".parse().unwrap();
        assert_eq!(spec.kind, GateKind::Token);
        assert_eq!(spec.burst, 24000);
        assert_eq!(spec.to_string().parse::<GateSpec>().unwrap(), spec);
        let shaper: GateSpec = "leaky_shaper:burst=5,rate=0.5".parse().unwrap();
        assert_eq!(shaper.rate, 0.5);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let cases = [
            ("token", "expected KIND"),
            ("bucket:rate=1,burst=1", "unknown gate kind"),
            ("token:rate=0,burst=1", "rate must be > 0"),
            ("token:rate=NaN,burst=1", "finite"),
            ("token:rate=inf,burst=1", "finite"),
            ("token:rate=-3,burst=1", "rate must be > 0"),
            ("token:rate=1,burst=0", "burst must be ≥ 1"),
            ("token:rate=1", "missing burst"),
            ("token:rate=x,burst=1", "not a number"),
            ("token:rate=1,burst=1,colour=red", "unknown key"),
            ("leaky_shaper:rate=1e-9,burst=4000000000", "overflows"),
        ];
        for (input, expected) in cases {
            let err = input.parse::<GateSpec>().unwrap_err().to_string();
            assert!(err.contains(expected), "{input}: {err}");
        }
    }
}
