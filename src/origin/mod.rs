//! The origin side of the pull-through cache (issue 20): the request a fill sends for a run of
//! blocks (`request`), what the origin's response head says and whether the fill may use it
//! (`response`), one origin's bounded connection pool and retry backoff (`pool`), all pure;
//! and the resolver thread that looks origin names up off the shards (`resolve`). The origin
//! client on the shard's ring drives these; nothing here opens a socket.

pub mod contract;
pub mod fetch;
pub mod pool;
pub mod request;
pub mod resolve;
pub mod response;
#[doc(hidden)]
pub mod testing;
pub mod tls;
