//! HTTP/1.1 protocol logic: pure functions over bytes, no I/O.

pub mod conditional;
pub mod date;
pub mod head_scan;
pub mod mime;
pub mod plan;
pub mod range;
pub mod request;
pub mod response;
