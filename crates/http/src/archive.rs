//! The archive hook: one record per file transfer the port served (a
//! `GET` of a file or a range of it, a `PUT`), handed to whoever stores
//! them (`fatpipe server --archive`: the archive's runs) through a bounded
//! queue, so a slow archive delays no connection: a record that finds the
//! queue full is dropped and counted ([`Sink::dropped`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::SystemTime;

/// Records waiting for the archive at most.
pub const QUEUE: usize = 1024;

/// One file transfer.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// `GET` or `PUT`.
    pub method: &'static str,
    /// The request's path as sent (percent-encoded, at most 1,024
    /// characters).
    pub path: String,
    /// The client.
    pub peer: SocketAddr,
    /// The answer's status (200, 206; 201, 204).
    pub status: u16,
    /// File bytes sent (`GET`) or written (`PUT`).
    pub bytes: u64,
    /// From the request's arrival until the last byte was handed to the
    /// socket (`GET`) or the file had its name (`PUT`).
    pub seconds: f64,
    /// When it ended.
    pub finished: SystemTime,
    /// Whether every byte of the answer was sent (a `GET` the client cut
    /// short is recorded too, with what was sent).
    pub complete: bool,
}

/// Where the port hands its records.
#[derive(Clone)]
pub struct Sink {
    tx: SyncSender<Transfer>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink and the receiving end of its queue ([`QUEUE`] records).
    pub fn new() -> (Sink, Receiver<Transfer>) {
        let (tx, rx) = sync_channel(QUEUE);
        (
            Sink {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    /// Queues a record; drops it (counted) if the queue is full or gone.
    pub fn record(&self, t: Transfer) {
        if self.tx.try_send(t).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The count of records dropped, for whoever reads the queue (a
    /// clone of the sink would keep the queue open).
    pub fn dropped_count(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.dropped)
    }
}

/// A response extension `PUT` sets: the body's bytes written to the file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written(pub(crate) u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let (sink, rx) = Sink::new();
        let t = Transfer {
            method: "GET",
            path: "/x/f".into(),
            peer: "127.0.0.1:1".parse().expect("addr"),
            status: 200,
            bytes: 1,
            seconds: 0.1,
            finished: SystemTime::now(),
            complete: true,
        };
        for _ in 0..QUEUE + 3 {
            sink.record(t.clone());
        }
        assert_eq!(sink.dropped(), 3);
        assert_eq!(rx.try_iter().count(), QUEUE);
        drop(rx);
        sink.record(t);
        assert_eq!(sink.dropped(), 4, "a sink whose reader is gone drops");
    }
}
