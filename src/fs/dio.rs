//! Alignment math for O_DIRECT reads: all of it, in one place, with checked arithmetic.
//!
//! A requested byte range `[pos, end)` is read as the aligned superset
//! `[align_down(pos), align_up(end))`, chunk by chunk, and only the requested bytes are sent.
//! An unaligned Range therefore costs the same as an aligned one.

/// Rounds `x` down to a multiple of `align` (a power of two).
pub fn align_down(x: u64, align: u64) -> u64 {
    assert!(align.is_power_of_two());
    x & !(align - 1)
}

/// Rounds `x` up to a multiple of `align` (a power of two); None on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    assert!(align.is_power_of_two());
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// One chunk of a transfer: read `read_len` bytes at `read_offset` into a buffer, then send
/// `send_len` bytes starting `skip` bytes into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    /// File offset of the read (aligned).
    pub read_offset: u64,
    /// Bytes to read (aligned, <= chunk size).
    pub read_len: usize,
    /// Bytes at the front of the buffer that precede the requested range.
    pub skip: usize,
    /// Bytes of the buffer to send.
    pub send_len: usize,
}

/// Plans the chunk that carries bytes from `pos` of the range `[pos, end)`, with reads aligned
/// to `align` (1 for buffered reads) and at most `chunk_bytes` long.
///
/// Requires `pos < end`, `chunk_bytes` a multiple of `align` (one block at least: a read
/// from inside a block then carries the rest of that block).
pub fn plan_chunk(pos: u64, end: u64, align: u64, chunk_bytes: usize) -> ChunkPlan {
    assert!(pos < end, "empty chunk");
    let chunk = chunk_bytes as u64;
    assert!(
        chunk >= align && chunk.is_multiple_of(align),
        "chunk must be a multiple of alignment"
    );
    let read_offset = align_down(pos, align);
    let skip = pos - read_offset;
    // `end` <= u64::MAX - align in practice (file sizes); saturate rather than overflow.
    let aligned_end = align_up(end, align).unwrap_or(align_down(u64::MAX, align));
    let read_len = (aligned_end - read_offset).min(chunk);
    let send_len = (read_len - skip).min(end - pos);
    ChunkPlan {
        read_offset,
        read_len: read_len as usize,
        skip: skip as usize,
        send_len: send_len as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn aligned_range_needs_no_skip() {
        let p = plan_chunk(1 << 20, 101 << 20, 4096, 512 << 10);
        assert_eq!(
            p,
            ChunkPlan {
                read_offset: 1 << 20,
                read_len: 512 << 10,
                skip: 0,
                send_len: 512 << 10
            }
        );
    }

    #[test]
    fn unaligned_start_reads_the_superset() {
        let p = plan_chunk(1000, 1000 + (100 << 20), 512, 512 << 10);
        assert_eq!(p.read_offset, 512);
        assert_eq!(p.skip, 488);
        assert_eq!(p.read_len, 512 << 10);
        assert_eq!(p.send_len, (512 << 10) - 488);
    }

    #[test]
    fn short_tail_rounds_the_read_up() {
        let p = plan_chunk(4096, 4100, 4096, 8192);
        assert_eq!(
            (p.read_offset, p.read_len, p.skip, p.send_len),
            (4096, 4096, 0, 4)
        );
    }

    #[test]
    fn buffered_reads_use_alignment_one() {
        let p = plan_chunk(3, 10, 1, 4);
        assert_eq!(
            (p.read_offset, p.read_len, p.skip, p.send_len),
            (3, 4, 0, 4)
        );
    }

    #[test]
    fn align_up_reports_overflow() {
        assert_eq!(align_up(u64::MAX, 4096), None);
        assert_eq!(align_up(4097, 4096), Some(8192));
        assert_eq!(align_down(4097, 4096), 4096);
    }

    proptest! {
        /// Walking a range chunk by chunk sends every byte exactly once, in order, from aligned
        /// reads that stay within one chunk.
        #[test]
        fn chunks_tile_the_range(start in 0u64..(1 << 40), len in 1u64..(8 << 20),
                                 align_shift in 0u32..13, chunk_mult in 2usize..300) {
            let align = 1u64 << align_shift;
            let chunk = chunk_mult * align as usize;
            let end = start + len;
            let mut pos = start;
            let mut steps = 0;
            while pos < end {
                let p = plan_chunk(pos, end, align, chunk);
                prop_assert_eq!(p.read_offset % align, 0);
                prop_assert_eq!(p.read_len as u64 % align, 0);
                prop_assert!(p.read_len <= chunk);
                prop_assert_eq!(p.read_offset + p.skip as u64, pos);
                prop_assert!(p.send_len > 0);
                prop_assert!(p.skip + p.send_len <= p.read_len);
                pos += p.send_len as u64;
                steps += 1;
                prop_assert!(steps <= len / (chunk as u64 - align).max(1) + 2);
            }
            prop_assert_eq!(pos, end);
        }
    }
}
