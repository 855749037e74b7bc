//! One connection to Redis, whether a single node or a Cluster, behind the
//! `ConnectionLike` the redis crate's scripts and pipelines take.
//!
//! Both kinds reconnect by themselves after an error (the connection
//! manager for a node, the cluster connection per slot owner), so callers
//! see failed calls during an outage and working calls after it, without
//! rebuilding anything.

use crate::problems::Problems;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
#[error("redis {urls}: {source}")]
pub struct RedisLinkError {
    urls: String,
    #[source]
    source: redis::RedisError,
}

/// A live connection to a node or a Cluster.
#[derive(Clone)]
pub enum RedisLink {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisLink {
    /// Connects to `urls` (one node, or a Cluster's seed nodes), with
    /// `timeout` for each connect and each reply.
    pub async fn connect(
        urls: &[String],
        cluster: bool,
        timeout: Duration,
    ) -> Result<Self, RedisLinkError> {
        let wrap = |source| RedisLinkError {
            urls: urls.join(","),
            source,
        };
        if cluster {
            let client = ClusterClient::builder(urls.to_vec())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(1)
                .build()
                .map_err(wrap)?;
            Ok(Self::Cluster(
                client.get_async_connection().await.map_err(wrap)?,
            ))
        } else {
            let url = urls.first().map(String::as_str).unwrap_or_default();
            let client = redis::Client::open(url).map_err(wrap)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1);
            Ok(Self::Node(
                client
                    .get_connection_manager_with_config(config)
                    .await
                    .map_err(wrap)?,
            ))
        }
    }
}

impl ConnectionLike for RedisLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// `urls` and `cluster` of a Redis section, reported under `section`.
pub fn check_redis_urls(section: &str, urls: &[String], cluster: bool, problems: &mut Problems) {
    let field = format!("{section}.urls");
    if urls.is_empty() {
        problems.add(&field, "name at least one redis://host:port");
    }
    for url in urls {
        if redis::parse_redis_url(url).is_none() {
            problems.add(&field, format!("{url:?} is not a redis://host:port URL"));
        }
    }
    if urls.len() > 1 && !cluster {
        problems.add(
            format!("{section}.cluster"),
            format!(
                "{} urls given: several seed nodes mean a Cluster, so set cluster = true (a single node takes one url)",
                urls.len()
            ),
        );
    }
}
