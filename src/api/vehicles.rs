//! `GET /vehicles/{id}`: the state query.

use super::{Api, ApiError, Authorized};
use crate::geofence::VehicleView;
use crate::pipeline::shard::vehicle_query::QueryError;
use axum::Json;
use axum::extract::{Path, State};

pub async fn get_one(
    _: Authorized,
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<VehicleView>, ApiError> {
    let queries =
        api.inner.vehicles.as_ref().ok_or_else(|| {
            ApiError::Unavailable("this instance answers no state queries".into())
        })?;
    match queries
        .ask(id.as_str().into(), api.inner.query_timeout)
        .await
    {
        Ok(Some(view)) => Ok(Json(view)),
        Ok(None) => Err(ApiError::NotFound(format!(
            "no vehicle {id:?} is tracked (never heard from, or forgotten after the idle expiry)"
        ))),
        Err(e @ (QueryError::Stopped | QueryError::Timeout(_))) => {
            Err(ApiError::Unavailable(e.to_string()))
        }
    }
}
