//! The origin side of the pull-through cache (issue 20), pure protocol, no I/O: the request a
//! fill sends for a run of blocks (`request`), and what the origin's response head says and
//! whether the fill may use it (`response`). The origin client on the shard's ring drives
//! these; nothing here opens a socket.

pub mod request;
pub mod response;
