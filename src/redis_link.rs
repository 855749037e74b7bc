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
#[error("redis {urls}: {}: {source}", .kind.says())]
pub struct RedisLinkError {
    urls: String,
    pub kind: RedisProblem,
    #[source]
    source: redis::RedisError,
}

/// What went wrong connecting, for an operator to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisProblem {
    /// The server refused the user or password (ACL).
    Credentials,
    /// The TLS handshake failed: a certificate not signed by the given
    /// CA, or a server that does not speak TLS.
    Tls,
    /// Anything else: unreachable, timed out, a bad URL.
    Other,
}

impl RedisProblem {
    fn of(e: &redis::RedisError) -> Self {
        let text = e.to_string().to_ascii_lowercase();
        if e.kind() == redis::ErrorKind::AuthenticationFailed
            || text.contains("wrongpass")
            || text.contains("noauth")
            || text.contains("noperm")
        {
            Self::Credentials
        } else if text.contains("certificate") || text.contains("tls") || text.contains("handshake")
        {
            Self::Tls
        } else {
            Self::Other
        }
    }

    fn says(self) -> &'static str {
        match self {
            Self::Credentials => "the server refused the credentials (user, password_file)",
            Self::Tls => {
                "TLS failed (ca; a rediss:// URL needs a server speaking TLS with a certificate ca signed)"
            }
            Self::Other => "cannot connect",
        }
    }
}

/// TLS and ACL credentials for a connection: managed Redis services
/// require both.
#[derive(Debug, Clone, Default)]
pub struct RedisSecurity {
    /// PEM of the CA that signed the server's certificate, for
    /// `rediss://` URLs (the system's roots otherwise).
    pub ca: Option<Vec<u8>>,
    pub user: Option<String>,
    pub password: Option<String>,
}

impl RedisSecurity {
    /// Reads the CA and password files.
    pub fn load(
        ca: Option<&std::path::Path>,
        user: Option<&str>,
        password_file: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let read =
            |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let password = password_file
            .map(|p| read(p).map(|b| String::from_utf8_lossy(&b).trim_end().to_owned()))
            .transpose()?;
        Ok(Self {
            ca: ca.map(read).transpose()?,
            user: user.map(str::to_owned),
            password,
        })
    }

    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: self.ca.clone(),
        }
    }

    fn info(&self, url: &str) -> redis::RedisResult<redis::ConnectionInfo> {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info()?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.user {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        Ok(info.set_redis_settings(settings))
    }
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
        security: &RedisSecurity,
    ) -> Result<Self, RedisLinkError> {
        let wrap = |source: redis::RedisError| RedisLinkError {
            urls: urls.join(","),
            kind: RedisProblem::of(&source),
            source,
        };
        // rustls needs one process-wide crypto provider; the same one
        // every other TLS connection here uses.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let tls = urls.iter().any(|u| u.starts_with("rediss://"));
        if cluster {
            let mut builder = ClusterClient::builder(urls.to_vec())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(1);
            if let Some(user) = &security.user {
                builder = builder.username(user);
            }
            if let Some(password) = &security.password {
                builder = builder.password(password);
            }
            if tls {
                builder = builder.certs(security.certificates());
            }
            let client = builder.build().map_err(wrap)?;
            Ok(Self::Cluster(
                client.get_async_connection().await.map_err(wrap)?,
            ))
        } else {
            let url = urls.first().map(String::as_str).unwrap_or_default();
            let info = security.info(url).map_err(wrap)?;
            let client = if tls {
                redis::Client::build_with_tls(info, security.certificates())
            } else {
                redis::Client::open(info)
            }
            .map_err(wrap)?;
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
