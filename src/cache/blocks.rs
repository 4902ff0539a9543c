//! Which blocks a response needs and how a fill asks for them: a Range on an object that is
//! not (all) cached fetches only the blocks it covers plus a bounded read-ahead, in runs of
//! missing blocks, each run one origin request (runs go out over several keep-alive
//! connections, so one client's cold download is not one request at a time).

use std::ops::Range;

pub use crate::config::MAX_READ_AHEAD_BLOCKS;

/// Blocks (numbers) that bytes `first..=last` of an object of `size` bytes in blocks of
/// `block_bytes` touch, and up to `read_ahead` blocks after them (never past the end).
pub fn blocks_for(
    first: u64,
    last: u64,
    size: u64,
    block_bytes: u32,
    read_ahead: u64,
) -> Range<u64> {
    assert!(
        first <= last && last < size,
        "bytes {first}-{last} of {size}"
    );
    let b = u64::from(block_bytes);
    let end = size.div_ceil(b);
    let start = first / b;
    start..(last / b + 1 + read_ahead).min(end)
}

/// The bytes (first, last inclusive) blocks `blocks` hold: what a fill asks the origin for
/// (the last block ends at the object's end).
pub fn byte_range(blocks: &Range<u64>, size: u64, block_bytes: u32) -> (u64, u64) {
    assert!(!blocks.is_empty(), "no blocks");
    let b = u64::from(block_bytes);
    let first = blocks.start * b;
    let last = (blocks.end * b).min(size) - 1;
    assert!(first <= last, "blocks {blocks:?} past the end of {size}");
    (first, last)
}

/// The runs of blocks in `blocks` that `present` says are not on disk, in order, each at
/// most `max_run` blocks long.
pub fn missing_runs(
    blocks: Range<u64>,
    present: impl Fn(u64) -> bool,
    max_run: u64,
) -> Vec<Range<u64>> {
    assert!(max_run > 0);
    let mut runs: Vec<Range<u64>> = Vec::new();
    for block in blocks {
        if present(block) {
            continue;
        }
        match runs.last_mut() {
            Some(r) if r.end == block && r.end - r.start < max_run => r.end += 1,
            _ => runs.push(block..block + 1),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1 << 20;

    #[test]
    fn a_range_takes_the_blocks_it_touches_and_a_bounded_read_ahead() {
        let size = 10 * u64::from(MIB) + 5;
        // Bytes inside block 3 only, read-ahead 2: blocks 3, 4, 5.
        assert_eq!(blocks_for(3 << 20, (3 << 20) + 10, size, MIB, 2), 3..6);
        // Spanning a boundary.
        assert_eq!(blocks_for((4 << 20) - 1, 4 << 20, size, MIB, 0), 3..5);
        // Never past the end: the tail block is 10 (5 bytes).
        assert_eq!(blocks_for(size - 1, size - 1, size, MIB, 8), 10..11);
        assert_eq!(byte_range(&(10..11), size, MIB), (10 << 20, size - 1));
        assert_eq!(byte_range(&(2..4), size, MIB), (2 << 20, (4 << 20) - 1));
    }

    #[test]
    fn missing_blocks_go_out_in_bounded_runs() {
        let present = |b: u64| b == 3 || b == 4 || b == 9;
        assert_eq!(
            missing_runs(0..12, present, 4),
            vec![0..3, 5..9, 10..12],
            "the holes, in order"
        );
        assert_eq!(missing_runs(0..10, |_| false, 4), vec![0..4, 4..8, 8..10]);
        assert!(missing_runs(0..5, |_| true, 4).is_empty());
    }
}
