//! Per-shard counters. Each shard is the only writer of its own `ShardMetrics` (relaxed
//! atomic stores, no contention); readers (the admin endpoint, tests) only load.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[doc = $doc:expr])* $name:ident),* $(,)?) => {
        /// Counters of one shard.
        #[derive(Default, Debug)]
        pub struct ShardMetrics {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
        }

        impl ShardMetrics {
            /// (name, value) of every counter, for rendering.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters! {
    /// Connections accepted.
    accepted,
    /// Connections refused because the shard was at its cap.
    refused_over_cap,
    /// Connections open now.
    open,
    /// Connections closed after a complete exchange (client close or Connection: close).
    closed_normal,
    /// Connections closed by a timeout (header, idle, send progress).
    closed_timeout,
    /// Connections closed because of a protocol error.
    closed_error,
    /// Connections aborted mid-response (file changed, I/O error, client reset).
    closed_abort,
    /// Responses with a 2xx status.
    responses_2xx,
    /// Responses with a 3xx status.
    responses_3xx,
    /// Responses with a 4xx status.
    responses_4xx,
    /// Responses with a 5xx status.
    responses_5xx,
    /// Body bytes sent from O_DIRECT reads.
    bytes_direct,
    /// Body bytes sent from RWF_DONTCACHE reads.
    bytes_dontcache,
    /// Body bytes sent from buffered reads.
    bytes_buffered,
    /// Bytes sent from memory (headers, error bodies, multipart framing).
    bytes_memory,
    /// Times a connection waited for an arena slot.
    arena_waits,
    /// SQEs submitted.
    ring_sqes,
    /// Completions handled.
    ring_cqes,
    /// io_uring_enter calls.
    ring_enters,
    /// Open-file cache hits.
    file_cache_hits,
    /// Open-file cache misses (opens).
    file_cache_misses,
    /// Accepts that failed for lack of descriptors (backoff applied).
    accept_errors,
    /// Receives that found no provided buffer (retried next tick).
    recv_no_buffers,
    /// Completions whose token did not match a live operation (a bug if non-zero).
    stray_completions,
}

impl ShardMetrics {
    /// Adds `v` to a counter (single writer: load + store is enough and cheaper than RMW).
    pub fn add(counter: &AtomicU64, v: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(v),
            Ordering::Relaxed,
        );
    }

    /// Sets a gauge.
    pub fn set(counter: &AtomicU64, v: u64) {
        counter.store(v, Ordering::Relaxed);
    }

    /// Counts a response by status class.
    pub fn count_status(&self, status: u16) {
        let c = match status {
            200..=299 => &self.responses_2xx,
            300..=399 => &self.responses_3xx,
            400..=499 => &self.responses_4xx,
            _ => &self.responses_5xx,
        };
        Self::add(c, 1);
    }
}

/// Renders all shards' counters in Prometheus text format, per shard and in total.
pub fn render_prometheus(shards: &[std::sync::Arc<ShardMetrics>]) -> String {
    let mut out = String::new();
    let snaps: Vec<_> = shards.iter().map(|m| m.snapshot()).collect();
    let Some(first) = snaps.first() else {
        return out;
    };
    for (i, (name, _)) in first.iter().enumerate() {
        let _ = writeln!(out, "# TYPE shardline_{name} gauge");
        let mut total = 0u64;
        for (shard, snap) in snaps.iter().enumerate() {
            let v = snap[i].1;
            total = total.wrapping_add(v);
            let _ = writeln!(out, "shardline_{name}{{shard=\"{shard}\"}} {v}");
        }
        let _ = writeln!(out, "shardline_{name}{{shard=\"all\"}} {total}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn renders_per_shard_and_total() {
        let a = Arc::new(ShardMetrics::default());
        let b = Arc::new(ShardMetrics::default());
        ShardMetrics::add(&a.accepted, 2);
        ShardMetrics::add(&b.accepted, 3);
        a.count_status(404);
        let text = render_prometheus(&[a, b]);
        assert!(text.contains("shardline_accepted{shard=\"0\"} 2\n"));
        assert!(text.contains("shardline_accepted{shard=\"all\"} 5\n"));
        assert!(text.contains("shardline_responses_4xx{shard=\"all\"} 1\n"));
    }
}
