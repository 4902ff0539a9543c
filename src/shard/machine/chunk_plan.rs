//! Chunk planning, pure: the next chunk of a body (head and small file in one, a framing or
//! zero run, an aligned file read sized to what the socket takes), a multipart part header
//! sharing its data's chunk, and the read caps. No state of the connection beyond its body.

use super::*;

/// Plans the next chunk of `body` into `slot`: the head and a small file's bytes in one, a
/// framing or zero run, or an aligned file read sized to what the socket takes.
pub(super) fn plan_chunk(
    body: &mut Body,
    slot: ArenaSlot,
    head_len: usize,
    chunk_bytes: usize,
    out: &mut Actions,
) -> Chunk {
    let mut chunk = Chunk {
        slot,
        state: ChunkState::Ready,
        send_off: 0,
        send_len: 0,
        sent: 0,
        read_buf_off: 0,
        read_file_off: 0,
        read_len: 0,
        read_need: 0,
        read_got: 0,
        send_started_ms: 0,
        source: body.source,
        zerocopy: false,
        bytes_from: BytesFrom::File,
        tls: None,
    };
    if plan_framed_part(body, chunk_bytes, &mut chunk) {
        return chunk;
    }
    let limit_cap = limit_read_cap(body);
    let seg = body
        .segments
        .front_mut()
        .expect("planning with nothing to plan");
    match seg {
        Segment::Mem { start, end } => {
            let n = ((*end - *start) as usize).min(chunk_bytes).min(limit_cap);
            out.push(Action::CopyFraming {
                slot,
                from: *start as usize,
                len: n,
                to: 0,
            });
            chunk.send_len = n as u32;
            chunk.source = Source::Memory;
            chunk.bytes_from = BytesFrom::Framing { at: *start };
            *start += n as u32;
            if *start == *end {
                body.segments.pop_front();
            }
        }
        Segment::Zero { remaining } => {
            let n = (*remaining).min(chunk_bytes as u64).min(limit_cap as u64) as usize;
            out.push(Action::ZeroFill { slot, len: n });
            chunk.send_len = n as u32;
            chunk.source = Source::Memory;
            chunk.bytes_from = BytesFrom::Zero;
            *remaining -= n as u64;
            if *remaining == 0 {
                body.segments.pop_front();
            }
        }
        Segment::File { pos, end } => {
            if body.inline_head {
                // Small file: header and body leave in one send from one slot.
                out.push(Action::CopyHeadToSlot { slot });
                let len = (*end - *pos) as usize;
                assert!(head_len + len <= chunk_bytes);
                chunk.state = ChunkState::Reading;
                chunk.send_len = (head_len + len) as u32;
                chunk.read_buf_off = head_len as u32;
                chunk.read_file_off = *pos;
                chunk.read_len = len as u32;
                chunk.read_need = len as u32;
                body.inline_head = false;
                *pos = *end;
            } else {
                let read_cap =
                    read_cap_bytes(body.read_size_bytes, body.align, chunk_bytes).min(limit_cap);
                // Never past the committed bytes of a pulled object (a block boundary or its
                // end, both on the read alignment, so the aligned read stays inside them).
                let readable = (*end).min(body.readable_end);
                assert!(*pos < readable, "a chunk planned past the readable bytes");
                let plan = crate::fs::dio::plan_chunk(*pos, readable, body.align, read_cap);
                chunk.state = ChunkState::Reading;
                chunk.send_off = plan.skip as u32;
                chunk.send_len = plan.send_len as u32;
                chunk.read_file_off = plan.read_offset;
                chunk.read_len = plan.read_len as u32;
                chunk.read_need = (plan.skip + plan.send_len) as u32;
                *pos += plan.send_len as u64;
            }
            if *pos >= *end {
                body.segments.pop_front();
            }
        }
    }
    chunk
}

/// A part header followed by its file range, planned into one chunk: the read lands at the
/// first aligned offset past the header's length, and the header is copied in front of the
/// data when the read is done (`on_read`). False (nothing planned) when the front is not
/// such a pair.
pub(super) fn plan_framed_part(body: &mut Body, chunk_bytes: usize, chunk: &mut Chunk) -> bool {
    let (Some(&Segment::Mem { start, end }), Some(&Segment::File { pos, end: file_end })) =
        (body.segments.front(), body.segments.get(1))
    else {
        return false;
    };
    let header = (end - start) as usize;
    let align = (body.align as usize).max(1);
    let read_at = header.div_ceil(align) * align;
    let room = chunk_bytes.saturating_sub(read_at) / align * align;
    if body.inline_head || header > SHARED_FRAMING_MAX_BYTES || room <= align {
        return false;
    }
    let read_cap = read_cap_bytes(body.read_size_bytes, body.align, chunk_bytes)
        .min(room)
        .min(limit_read_cap(body));
    let plan = crate::fs::dio::plan_chunk(pos, file_end, body.align, read_cap);
    chunk.state = ChunkState::Reading;
    chunk.bytes_from = BytesFrom::FramedFile {
        at: start,
        len: header as u32,
    };
    chunk.read_buf_off = read_at as u32;
    chunk.send_off = (read_at + plan.skip - header) as u32;
    chunk.send_len = (header + plan.send_len) as u32;
    chunk.read_file_off = plan.read_offset;
    chunk.read_len = plan.read_len as u32;
    chunk.read_need = (plan.skip + plan.send_len) as u32;
    // The header is planned; the file range goes on from where this read ends.
    body.segments.pop_front();
    let pos = pos + plan.send_len as u64;
    if pos >= file_end {
        body.segments.pop_front();
    } else {
        body.segments[0] = Segment::File { pos, end: file_end };
    }
    true
}

/// The most a rate-limited body may read for its next chunk: its allowance, aligned down for
/// O_DIRECT (the planned bytes may pass a small allowance by part of a block; the limiters
/// count what was planned).
pub(super) fn limit_read_cap(body: &Body) -> usize {
    if body.limit_cap_bytes == usize::MAX {
        return usize::MAX;
    }
    let align = (body.align as usize).max(1);
    // One block at least (a read from inside it sends the rest of it): the planned bytes
    // pass the allowance by less than a block.
    (body.limit_cap_bytes / align * align).max(align)
}

/// Bytes a file read may ask for: the connection's estimate of what its socket takes,
/// rounded up to the read alignment, between `MIN_READ_BYTES` and the whole aligned blocks a
/// chunk holds, and two blocks when they fit (a read that starts inside a block may need the
/// next one too). A pulled object's alignment is its cache block, up to half a chunk: over
/// TLS a chunk carries a little less plaintext than that, so only one block fits there.
pub fn read_cap_bytes(estimate: usize, align: u64, chunk_bytes: usize) -> usize {
    let align = (align as usize).max(1);
    assert!(
        chunk_bytes >= align,
        "a chunk smaller than its read alignment"
    );
    let most = chunk_bytes / align * align;
    let want = estimate.clamp(MIN_READ_BYTES.min(chunk_bytes), chunk_bytes);
    let cap = want.div_ceil(align) * align;
    cap.max(2 * align).min(most)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_caps_fit_a_tls_chunk_smaller_than_the_minimum_read() {
        // A 64 KiB chunk carries 60 KiB of plaintext over TLS: below MIN_READ_BYTES.
        let cap = crate::tls::record::chunk_plaintext_capacity(64 * 1024, 16 * 1024);
        assert!(cap < MIN_READ_BYTES);
        assert_eq!(read_cap_bytes(0, 4096, cap), cap);
        assert_eq!(read_cap_bytes(usize::MAX, 512, cap), cap);
        assert_eq!(read_cap_bytes(10_000, 1, cap), cap);
    }

    #[test]
    fn read_caps_are_whole_blocks_of_a_pulled_object() {
        // Block = half a chunk (the largest allowed): two blocks in cleartext, whatever the
        // estimate; over TLS the chunk holds a little less, so one.
        let (block, chunk) = (256 * 1024, 512 * 1024);
        assert_eq!(read_cap_bytes(4096, block as u64, chunk), chunk);
        assert_eq!(read_cap_bytes(usize::MAX, block as u64, chunk), chunk);
        let tls = crate::tls::record::chunk_plaintext_capacity(chunk, 16 * 1024);
        assert_eq!(read_cap_bytes(4096, block as u64, tls), block);
        assert_eq!(read_cap_bytes(usize::MAX, block as u64, tls), block);
        // Each plans: a read inside the block sends up to its end.
        let plan = crate::fs::dio::plan_chunk(1000, 10 << 20, block as u64, block);
        assert_eq!((plan.read_offset, plan.read_len), (0, block));
        assert_eq!(plan.send_len, block - 1000);
    }
}
