//! How much a client may take: the per-connection rate limit (`rate`, nginx's `limit_rate`,
//! also per path prefix) and the edge's shared egress cap (`egress`).
//!
//! Both are pure arithmetic over a clock the caller passes: the shard's machine asks them how
//! many bytes a response may plan now, and when it may plan more. It plans reads only within
//! that allowance, so a limited connection that waits holds no arena slot: its bytes are on
//! disk, not in memory.

pub mod egress;
pub mod rate;

pub use egress::EgressBucket;
pub use rate::{RateLimit, RateSpec, LIMIT_STEPS_PER_S, LIMIT_STEP_MIN_BYTES};
