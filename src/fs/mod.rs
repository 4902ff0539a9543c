//! File-system side of a request: URL path resolution and O_DIRECT alignment math.

pub mod dio;
pub mod resolve;
