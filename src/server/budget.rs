//! Budgets of request bytes the gRPC port holds: one per connection and one for the process.
//!
//! Why: HTTP/2 flow control bounds what a client may send before the server asks for more, and
//! the server asks for more by giving window back. A call whose message fits the window (every
//! `ShouldRateLimit` call does) never needs any: its bytes are all in before it is decoded.
//! Only a larger message needs window given back while it is still incomplete, and the bytes it
//! holds until it is complete count against both budgets first. When a budget is spent, the
//! call waits (and so does its sender, for lack of window) until another call's message is
//! consumed or its connection goes, or until the body timeout ends it. Half-sent messages on one
//! connection can then hold at most the connection's budget, and on all connections together at
//! most the process's.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes held by one connection's incomplete messages.
pub struct ConnectionBudget {
    process: Arc<Semaphore>,
    connection: Arc<Semaphore>,
    capacity: usize,
}

impl ConnectionBudget {
    /// A budget of `per_connection` bytes for a new connection, drawing on `process` as well.
    pub fn new(process: &Arc<Semaphore>, per_connection: usize) -> Self {
        let capacity = per_connection.min(Semaphore::MAX_PERMITS);
        ConnectionBudget {
            process: Arc::clone(process),
            connection: Arc::new(Semaphore::new(capacity)),
            capacity,
        }
    }

    /// Waits until `bytes` more fit both budgets; they are given back when the [`Held`] that
    /// they join is dropped. `bytes` over the connection's whole budget never fit: `false`.
    pub async fn reserve(&self, held: &mut Held, bytes: usize) -> bool {
        let Ok(permits) = u32::try_from(bytes) else {
            return false;
        };
        if bytes > self.capacity {
            return false;
        }
        let Ok(connection) = Arc::clone(&self.connection)
            .acquire_many_owned(permits)
            .await
        else {
            return false;
        };
        let Ok(process) = Arc::clone(&self.process).acquire_many_owned(permits).await else {
            return false;
        };
        held.join(connection);
        held.join(process);
        true
    }
}

/// The bytes one call holds against the budgets, given back when it is dropped.
#[derive(Default)]
pub struct Held {
    permits: Vec<OwnedSemaphorePermit>,
}

impl Held {
    fn join(&mut self, permit: OwnedSemaphorePermit) {
        match self
            .permits
            .iter_mut()
            .find(|held| Arc::ptr_eq(held.semaphore(), permit.semaphore()))
        {
            Some(held) => held.merge(permit),
            None => self.permits.push(permit),
        }
    }

    /// Bytes held (per budget).
    pub fn bytes(&self) -> usize {
        self.permits.first().map_or(0, |p| p.num_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn bytes_wait_for_room_and_come_back_on_drop() {
        let process = Arc::new(Semaphore::new(100));
        let one = ConnectionBudget::new(&process, 60);
        let two = ConnectionBudget::new(&process, 60);
        let mut first = Held::default();
        assert!(one.reserve(&mut first, 30).await);
        assert!(one.reserve(&mut first, 30).await);
        assert_eq!(first.bytes(), 60);
        let mut second = Held::default();
        let over_connection =
            tokio::time::timeout(Duration::from_millis(50), one.reserve(&mut second, 1)).await;
        assert!(over_connection.is_err(), "the connection's budget is spent");
        assert!(two.reserve(&mut second, 40).await);
        let over_process =
            tokio::time::timeout(Duration::from_millis(50), two.reserve(&mut second, 1)).await;
        assert!(over_process.is_err(), "the process's budget is spent");
        drop(first);
        assert_eq!(process.available_permits(), 60);
        assert!(one.reserve(&mut Held::default(), 60).await);
    }
}
