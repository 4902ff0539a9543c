//! shardline: a shard-per-core io_uring HTTP/1.1 download engine for game-update CDN edges.
//!
//! The folder layout is the architecture: `shard/` is the per-core event loop (and the only
//! place with `unsafe`, in `shard/ring` and `shard/ring_sys`), `http/` is pure protocol logic,
//! `fs/` is path resolution and O_DIRECT alignment math, `tls/` is HTTPS (certificates,
//! ticket keys, the record layer, one connection's TLS session), `topology`/`plan`/`steering` decide
//! where shards run and which shard a connection lands on, `limits/` how much a client may take,
//! `ring_api/` the ring's interface (operations, slots, tokens) that the shard and the fill
//! share, `cache/` the pull-through cache's storage (its journal, index and eviction) and `origin/` the
//! requests it sends and the responses it judges.

// `unsafe` is refused everywhere but the ring modules (allowed in `shard/mod.rs`), and every
// `unsafe` block there must say who keeps the memory alive until the kernel is done with it.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod admin;
pub mod cache;
pub mod client;
pub mod config;
pub mod doctor;
pub mod fill;
pub mod fs;
pub mod handover;
pub mod histogram;
pub mod http;
pub mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod origin;
pub mod placement;
pub mod ring_api;
pub mod server;
pub mod shard;
pub mod signing;
pub mod steering;
pub mod tls;
pub mod topology;
