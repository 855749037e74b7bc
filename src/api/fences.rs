//! The fence endpoints.

use super::{Api, ApiError, Authorized};
use crate::clock::receive_now_ms;
use crate::geofence::registry::ChangeError;
use crate::geofence::{Fence, FenceDefect, FenceErrors, parse_features};
use crate::model::FenceId;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// A fence as the API serves it.
#[derive(Serialize)]
pub struct FenceOut {
    id: FenceId,
    version: u64,
    /// When its version was made (receive clock, unix ms).
    changed_ms: i64,
    feature: Box<RawValue>,
}

impl FenceOut {
    fn of(fence: &Fence) -> Self {
        let feature = RawValue::from_string(fence.source.feature.clone())
            .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"));
        Self {
            id: fence.id.clone(),
            version: fence.version,
            changed_ms: fence.changed_ms,
            feature,
        }
    }
}

/// What a change answers.
#[derive(Serialize)]
pub struct Changed {
    /// The fence set version the change made.
    version: u64,
    /// Live fences after it.
    fences: usize,
}

fn changed(set: &crate::geofence::FenceIndex) -> Json<Changed> {
    Json(Changed {
        version: set.version(),
        fences: set.len(),
    })
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::ReadOnly => ApiError::Conflict(e.to_string()),
            ChangeError::Invalid(errors) => ApiError::Invalid(errors),
            ChangeError::Unknown(_) => ApiError::NotFound(e.to_string()),
            ChangeError::Repeated(_) => ApiError::BadRequest(e.to_string()),
            ChangeError::Journal(_) => ApiError::Unavailable(e.to_string()),
        }
    }
}

/// The request body as JSON, or the defect `fences check` would name.
fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::Invalid(FenceErrors(vec![FenceDefect {
            index: None,
            id: None,
            defect: format!("not JSON: {e}"),
        }]))
    })
}

/// An id as a Feature may carry it: a non-empty string or a number.
fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

pub async fn put(
    _: Authorized,
    State(api): State<Api>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Changed>, ApiError> {
    let mut feature = json_body(&body)?;
    let Some(object) = feature.as_object_mut() else {
        return Err(ApiError::BadRequest(
            "the body must be one GeoJSON Feature (an object)".into(),
        ));
    };
    match object.get("id").map(id_text) {
        None => {
            object.insert("id".into(), Value::String(id.clone()));
        }
        Some(Some(given)) if given == id => {}
        Some(given) => {
            return Err(ApiError::BadRequest(format!(
                "the Feature's id {} is not the path's {id:?}",
                given.map_or("(not a string or number)".into(), |g| format!("{g:?}"))
            )));
        }
    }
    let fences = parse_features(std::slice::from_ref(&feature))?.fences;
    let set = api
        .inner
        .fences
        .change(fences, Vec::new(), receive_now_ms())
        .await?;
    Ok(changed(&set))
}

pub async fn delete(
    _: Authorized,
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let set = api
        .inner
        .fences
        .change(Vec::new(), vec![id.as_str().into()], receive_now_ms())
        .await?;
    Ok(changed(&set))
}

pub async fn get_one(
    _: Authorized,
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<FenceOut>, ApiError> {
    let set = api.inner.fences.current();
    let fence = set
        .find(&id)
        .map(|f| set.fence(f))
        .ok_or_else(|| ApiError::NotFound(format!("no fence {id:?}")))?;
    Ok(Json(FenceOut::of(fence)))
}

#[derive(Deserialize)]
pub struct Page {
    /// The last id of the page before.
    after: Option<String>,
    limit: Option<usize>,
}

/// A page of fences, in id order.
#[derive(Serialize)]
pub struct FencePage {
    /// The fence set version the page is of.
    version: u64,
    fences: Vec<FenceOut>,
    /// `after` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<FenceId>,
}

pub async fn list(
    _: Authorized,
    State(api): State<Api>,
    Query(page): Query<Page>,
) -> Result<Json<FencePage>, ApiError> {
    let limit = page.limit.unwrap_or(api.inner.page_size);
    if limit == 0 || limit > api.inner.page_size {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to {}",
            api.inner.page_size
        )));
    }
    let set = api.inner.fences.current();
    let all = set.fences_by_id();
    let start = match &page.after {
        Some(after) => all.partition_point(|f| &*f.id <= after.as_str()),
        None => 0,
    };
    let fences: Vec<FenceOut> = all[start..]
        .iter()
        .take(limit)
        .map(|f| FenceOut::of(f))
        .collect();
    let next = (start + fences.len() < all.len())
        .then(|| fences.last().map(|f| f.id.clone()))
        .flatten();
    Ok(Json(FencePage {
        version: set.version(),
        fences,
        next,
    }))
}

pub async fn batch(
    _: Authorized,
    State(api): State<Api>,
    body: Bytes,
) -> Result<Json<Changed>, ApiError> {
    let doc = json_body(&body)?;
    let not_a_collection = || {
        ApiError::BadRequest(
            "the body must be a GeoJSON FeatureCollection, with an optional \"delete\": [ids]"
                .into(),
        )
    };
    if doc.get("type").and_then(Value::as_str) != Some("FeatureCollection") {
        return Err(not_a_collection());
    }
    let features = match doc.get("features") {
        Some(Value::Array(features)) => features.as_slice(),
        None => &[],
        Some(_) => return Err(not_a_collection()),
    };
    let deletes = match doc.get("delete") {
        None => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| id_text(v).map(|id| FenceId::from(id.as_str())))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(not_a_collection)?,
        Some(_) => return Err(not_a_collection()),
    };
    let fences = parse_features(features)?.fences;
    let set = api
        .inner
        .fences
        .change(fences, deletes, receive_now_ms())
        .await?;
    Ok(changed(&set))
}

impl From<FenceErrors> for ApiError {
    fn from(errors: FenceErrors) -> Self {
        ApiError::Invalid(errors)
    }
}
