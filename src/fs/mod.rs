//! File-system side of a request: URL path resolution and O_DIRECT alignment math; files a
//! request names confined beneath a directory, and secrets read from private files.

pub mod confine;
pub mod dio;
pub mod resolve;
pub mod secret;
