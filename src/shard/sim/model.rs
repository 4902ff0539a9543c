//! What the simulated network and the simulated origin share: the files served (with every
//! version they had) and the byte queues both ends drain.

use std::collections::VecDeque;
use std::path::PathBuf;

/// A file under the served root, with every content it has had.
pub struct SimFile {
    /// URL path (`/name`).
    pub url: String,
    /// Where it lives.
    pub path: PathBuf,
    /// Contents, oldest first: a response must match one of them throughout.
    pub versions: Vec<Vec<u8>>,
    /// Served by the simulated origin through the pull-through cache (`path` is not used).
    pub pulled: bool,
}

/// The first `n` bytes of `queue`, taken off it (by slices: a byte at a time is slow in a
/// debug build, and the simulator moves every byte of every response).
pub fn take_front(queue: &mut VecDeque<u8>, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let (a, b) = queue.as_slices();
    let from_a = n.min(a.len());
    out.extend_from_slice(&a[..from_a]);
    out.extend_from_slice(&b[..n - from_a]);
    queue.drain(..n);
    out
}
