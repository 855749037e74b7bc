//! The state query's way in: a question about one vehicle goes to the
//! worker of its shard, which asks its state between batches.

use super::shard_of;
use crate::geofence::VehicleView;
use crate::model::VehicleId;
use crate::state::VehicleQuery;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Questions a worker may have waiting.
const WAITING: usize = 64;

/// Why a question got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the pipeline is stopping")]
    Stopped,
    #[error("no answer within {0:?}: the vehicle's shard is behind")]
    Timeout(Duration),
}

/// Each shard's question queue, in shard order.
#[derive(Clone)]
pub struct VehicleQueries {
    shards: Vec<mpsc::Sender<VehicleQuery>>,
}

impl VehicleQueries {
    /// Queues for `shards` workers, and each worker's end.
    pub fn channels(shards: usize) -> (Self, Vec<mpsc::Receiver<VehicleQuery>>) {
        let (senders, receivers) = (0..shards).map(|_| mpsc::channel(WAITING)).unzip();
        (Self { shards: senders }, receivers)
    }

    /// The vehicle's state once its shard's earlier batches are written
    /// (`None`: not tracked), waiting at most `timeout`.
    pub async fn ask(
        &self,
        vehicle: VehicleId,
        timeout: Duration,
    ) -> Result<Option<VehicleView>, QueryError> {
        let shard = &self.shards[shard_of(&vehicle, self.shards.len())];
        let (reply, answer) = oneshot::channel();
        let asked = async {
            shard
                .send(VehicleQuery { vehicle, reply })
                .await
                .map_err(|_| QueryError::Stopped)?;
            answer.await.map_err(|_| QueryError::Stopped)
        };
        tokio::time::timeout(timeout, asked)
            .await
            .map_err(|_| QueryError::Timeout(timeout))?
    }
}
