//! `geogate fences export`: the fence set a geogate runs, as a GeoJSON
//! FeatureCollection in id order, each Feature as it was given. From the
//! running instance's API when `[api]` is configured and answers; else
//! from the state file (a geogate holding it refuses the read).

use crate::config::Config;
use crate::state::StateBackend;
use crate::state::embedded::EmbeddedStore;
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the API at {url}: {detail}")]
    Api { url: String, detail: String },
    #[error("{0}")]
    Store(String),
    #[error(
        "with [state] backend = \"memory\" nothing is kept: configure [api] and export from the running geogate"
    )]
    NothingKept,
}

/// The set as GeoJSON text, and its version.
pub fn export(config: &Config) -> Result<(String, u64), ExportError> {
    if let Some(api) = &config.api {
        match from_api(api) {
            Err(ExportError::Api { detail, .. }) if detail.starts_with("not running") => {}
            other => return other,
        }
    }
    from_store(config)
}

fn collection(features: Vec<Value>, version: u64) -> (String, u64) {
    let doc = serde_json::json!({
        "type": "FeatureCollection",
        "geogate_fence_set_version": version,
        "features": features,
    });
    (doc.to_string(), version)
}

fn from_store(config: &Config) -> Result<(String, u64), ExportError> {
    if config.state.backend != StateBackend::Embedded {
        return Err(ExportError::NothingKept);
    }
    let (_, recovered) = EmbeddedStore::open(&config.state.embedded.path, &config.state)
        .map_err(|e| ExportError::Store(e.to_string()))?;
    let stored = recovered.fences.unwrap_or_default();
    let features = stored
        .fences
        .iter()
        .map(|(_, _, _, feature)| serde_json::from_str(feature).unwrap_or(Value::Null))
        .collect();
    Ok(collection(features, stored.version))
}

fn from_api(api: &crate::api::ApiConfig) -> Result<(String, u64), ExportError> {
    let url = format!("http://{}/fences", api.listen);
    let failed = |detail: String| ExportError::Api {
        url: url.clone(),
        detail,
    };
    let token = api.load_token().map_err(&failed)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(e.to_string()))?;
    runtime.block_on(async {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let (mut features, mut after, mut version) = (Vec::new(), None::<String>, None);
        loop {
            let mut request = client.get(&url).bearer_auth(&token);
            if let Some(after) = &after {
                request = request.query(&[("after", after)]);
            }
            let response = request.send().await.map_err(|e| {
                failed(if e.is_connect() {
                    format!("not running ({e})")
                } else {
                    e.to_string()
                })
            })?;
            let status = response.status();
            let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
            let page: Value = serde_json::from_slice(&body).map_err(|e| failed(e.to_string()))?;
            if !status.is_success() {
                return Err(failed(format!("{status}: {}", page["error"])));
            }
            let page_version = page["version"].as_u64().unwrap_or(0);
            // A change between pages would mix two sets: start again.
            if version.is_some_and(|v| v != page_version) {
                (features, after) = (Vec::new(), None);
                version = None;
                continue;
            }
            version = Some(page_version);
            for fence in page["fences"].as_array().into_iter().flatten() {
                features.push(fence["feature"].clone());
            }
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return Ok(collection(features, page_version)),
            }
        }
    })
}
