//! The HTTP API: fences as live data, and the state of one vehicle.
//!
//! * `PUT /fences/{id}`: one GeoJSON Feature, validated as `fences check`
//!   validates a file; `DELETE /fences/{id}`; `GET /fences/{id}`;
//!   `GET /fences?after=…&limit=…`, in id order, paged;
//!   `POST /fences:batch`: a FeatureCollection (and optionally `"delete"`:
//!   ids) applied all or nothing.
//! * `GET /vehicles/{id}`: its fences now, its dwells in progress, its
//!   last fix, once the events before the question are written.
//!
//! Every request carries the bearer token (`[api]`); a change answers
//! once it is durable and live, with the fence set version it made.

pub mod config;
mod fences;
mod vehicles;

use crate::geofence::registry::FenceRegistry;
use crate::pipeline::shard::vehicle_query::VehicleQueries;
use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use config::ApiConfig;

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

struct Inner {
    /// SHA-256 of the token: requests are compared digest to digest, so
    /// the comparison's time says nothing about the token.
    token_digest: [u8; 32],
    fences: FenceRegistry,
    /// `None` where no pipeline answers state queries.
    vehicles: Option<VehicleQueries>,
    page_size: usize,
    query_timeout: Duration,
}

impl Api {
    pub fn new(
        config: &ApiConfig,
        token: &str,
        fences: FenceRegistry,
        vehicles: Option<VehicleQueries>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                token_digest: Sha256::digest(token.as_bytes()).into(),
                fences,
                vehicles,
                page_size: config.page_size,
                query_timeout: Duration::from_millis(config.query_timeout_ms),
            }),
        }
    }

    pub fn router(self, max_body_bytes: usize) -> Router {
        Router::new()
            .route(
                "/fences/{id}",
                get(fences::get_one).put(fences::put).delete(fences::delete),
            )
            .route("/fences", get(fences::list))
            .route("/fences:batch", post(fences::batch))
            .route("/vehicles/{id}", get(vehicles::get_one))
            .layer(DefaultBodyLimit::max(max_body_bytes))
            .with_state(self)
    }
}

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    api: Api,
    max_body_bytes: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, api.router(max_body_bytes))
        .with_graceful_shutdown(shutdown)
        .await
}

/// A request that carried the right bearer token.
pub struct Authorized;

impl FromRequestParts<Api> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(ApiError::Unauthorized)?;
        let digest: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        if digest == api.inner.token_digest {
            Ok(Authorized)
        } else {
            Err(ApiError::Unauthorized)
        }
    }
}

/// An answer other than success, as JSON `{"error": …}` with its status.
#[derive(Debug)]
pub enum ApiError {
    Unauthorized,
    NotFound(String),
    /// The request's fences, with every defect (`fences check`'s).
    Invalid(crate::geofence::FenceErrors),
    BadRequest(String),
    /// The fences are read-only here (`fences.source = "file"`).
    Conflict(String),
    Unavailable(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                json!({"error": "missing or wrong bearer token"}),
            ),
            ApiError::NotFound(what) => (StatusCode::NOT_FOUND, json!({ "error": what })),
            ApiError::Invalid(errors) => (
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid fence definition(s)", "errors": errors.0}),
            ),
            ApiError::BadRequest(why) => (StatusCode::BAD_REQUEST, json!({ "error": why })),
            ApiError::Conflict(why) => (StatusCode::CONFLICT, json!({ "error": why })),
            ApiError::Unavailable(why) => {
                (StatusCode::SERVICE_UNAVAILABLE, json!({ "error": why }))
            }
        };
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
