//! shardline: a shard-per-core io_uring HTTP/1.1 download engine for game-update CDN edges.
//!
//! The folder layout is the architecture: `shard/` is the per-core event loop (and the only
//! place with `unsafe`, in `shard/ring`), `http/` is pure protocol logic, `fs/` is path
//! resolution and O_DIRECT alignment math, `topology`/`plan` decide where shards run.

pub mod config;
pub mod doctor;
pub mod fs;
pub mod http;
