//! `[api]`: the HTTP API for fences and the state of vehicles.

use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Where the token comes from when the file names none.
pub const TOKEN_ENV: &str = "GEOGATE_API_TOKEN";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Loopback by default: positions are personal data.
    pub listen: SocketAddr,
    /// The bearer token every request must carry; or `token_file`; else
    /// the environment's `GEOGATE_API_TOKEN`.
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    /// Fences per page of `GET /fences` at most.
    pub page_size: usize,
    /// Largest request body (a batch of fences), bytes.
    pub max_body_bytes: usize,
    /// How long a state query waits for the vehicle's shard, ms.
    pub query_timeout_ms: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            token: None,
            token_file: None,
            page_size: 100,
            max_body_bytes: 64 << 20,
            query_timeout_ms: 5_000,
        }
    }
}

impl ApiConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.token.is_some() && self.token_file.is_some() {
            problems.add("api.token", "give token or token_file, not both");
        }
        if self.token.as_deref().is_some_and(|t| t.len() < 16) {
            problems.add(
                "api.token",
                "must be at least 16 characters: it guards positions, which are personal data",
            );
        }
        if !(1..=10_000).contains(&self.page_size) {
            problems.add("api.page_size", "must be 1 to 10000");
        }
        if self.max_body_bytes < 1024 {
            problems.add("api.max_body_bytes", "must be ≥ 1024");
        }
        if self.query_timeout_ms == 0 {
            problems.add("api.query_timeout_ms", "must be ≥ 1");
        }
    }

    /// The token, from the file, the config or the environment.
    pub fn load_token(&self) -> Result<String, String> {
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| format!("api.token_file {}: {e}", path.display()))?
                .trim()
                .to_owned(),
            (None, None) => std::env::var(TOKEN_ENV).map_err(|_| {
                format!("[api] needs a bearer token: api.token, api.token_file or the environment's {TOKEN_ENV}")
            })?,
        };
        if token.len() < 16 {
            return Err("the API token must be at least 16 characters".into());
        }
        Ok(token)
    }
}
