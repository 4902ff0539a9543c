//! The ring's interface, below both the shard and the fill: the operations a shard (and the
//! fill's fetches on its ring) submit (`ops::RingOps`, with the real io_uring behind it in
//! `shard::ring` and the simulator's fake in `shard::sim`), the completions they get back,
//! the typed slots that name registered memory and descriptors (`slots`), and the tokens that
//! route a completion to its owner (`token`). No `unsafe` here: buffers are named by index.

pub mod custody;
pub mod ops;
pub mod slots;
pub mod token;

/// Alignment of every arena chunk (O_DIRECT needs it; the fill's block reads and writes too).
pub const ARENA_ALIGN_BYTES: u32 = 4096;
