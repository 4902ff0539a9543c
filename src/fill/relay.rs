//! Pass-through (issue 20): a pulled request whose fill cannot get room on the cache's disk is
//! streamed from the origin to its one client without being stored.
//!
//! The origin side is an ordinary block fetch (`origin::fetch::BlockFetch`) run by the
//! shard's `Filler` with no data file: each piece it would have written is *delivered*
//! instead, and its write completes only once the client's chunks have copied all of it. The
//! client side is an ordinary file response whose reads (`Action::Read`) are answered from
//! those pieces instead of a disk. `Relay` matches the two: a pending piece (bytes of the
//! object in the fetch's slot) against a pending read (bytes of the object the connection
//! wants in its chunk's slot), and says what to copy and what is done.
//!
//! So a pass-through holds at most the fetch's slot and the connection's chunk (its
//! pipeline is one chunk deep), the origin is paced by the client (the fetch receives the
//! next piece only when this one is delivered), and a relayed chunk is never given back
//! (its bytes cannot be read again): `MAX_PASS_THROUGHS_PER_SHARD` bounds what they hold.

use crate::ring_api::slots::ArenaSlot;

/// Most pass-throughs one shard runs at once (each holds at most two arena slots); past it,
/// a fill without room is answered 503 as before.
pub const MAX_PASS_THROUGHS_PER_SHARD: usize = 8;

/// Bytes of the object in the fetch's slot, waiting to be copied to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    slot: ArenaSlot,
    /// The object's offset of the slot's first byte.
    file_offset: u64,
    /// Bytes of the object in the slot (the fetch's write length less the zero padding).
    len: usize,
}

/// A chunk read of the connection's response, answered from pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Read {
    slot: ArenaSlot,
    buf_off: usize,
    len: usize,
    file_offset: u64,
    got: usize,
}

/// One thing to do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Copy `len` bytes from arena slot `from` at `from_off` to slot `to` at `to_off`.
    Copy {
        /// The fetch's slot.
        from: ArenaSlot,
        /// Where in it.
        from_off: usize,
        /// The connection's chunk.
        to: ArenaSlot,
        /// Where in it.
        to_off: usize,
        /// How many bytes.
        len: usize,
    },
    /// The piece is used up: its write completes (`Filler::delivered`), the fetch goes on.
    PieceDone,
    /// The read is complete with `len` bytes: it completes on the connection.
    ReadDone {
        /// The chunk's slot.
        slot: ArenaSlot,
        /// Bytes read.
        len: usize,
    },
}

/// Why a read cannot be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayError {
    /// A read before what the fetch has already delivered (the reads of a response go
    /// forward only; a bug if it happens).
    Behind,
}

/// One pass-through's matching of pieces and reads (see the module doc).
#[derive(Debug)]
pub struct Relay {
    /// The fetch's job id.
    pub job: u64,
    /// The first byte it brings: the connection's reads from there on are its (a response
    /// that began from the cache reads what is on disk before it).
    pub from: u64,
    /// The object's size (pieces are cut at it).
    size: u64,
    piece: Option<Piece>,
    /// Bytes of the current piece already copied or skipped.
    used: usize,
    read: Option<Read>,
    /// The fetch ended: no more pieces come (`Some(true)`: every byte of its range came).
    pub ended: Option<bool>,
}

impl Relay {
    /// A relay for fetch `job` of an object of `size` bytes, from byte `from` on.
    pub fn new(job: u64, size: u64, from: u64) -> Relay {
        Relay {
            job,
            from,
            size,
            piece: None,
            used: 0,
            read: None,
            ended: None,
        }
    }

    /// The fetch has `write_len` bytes (zero padded past the object's end) of the object at
    /// `file_offset` in `slot`.
    pub fn piece(&mut self, slot: ArenaSlot, file_offset: u64, write_len: usize) {
        assert!(self.piece.is_none(), "two pieces of one fetch at once");
        let len = (self.size.saturating_sub(file_offset)).min(write_len as u64) as usize;
        self.piece = Some(Piece {
            slot,
            file_offset,
            len,
        });
        self.used = 0;
    }

    /// The connection wants `len` bytes of the object at `file_offset` in `slot` at
    /// `buf_off`. A read aligned past the object's end (a response that began on the cache's
    /// block-aligned reads) is answered with the bytes there are, as a file's read is.
    /// The object's size, learnt from its reply's head (a relay begun before it knew).
    pub fn set_size(&mut self, size: u64) {
        assert!(self.piece.is_none(), "a piece before the head");
        self.size = size;
    }

    pub fn read(&mut self, slot: ArenaSlot, buf_off: usize, len: usize, file_offset: u64) {
        assert!(self.read.is_none(), "two reads of one pass-through at once");
        let len = (len as u64).min(self.size.saturating_sub(file_offset)) as usize;
        assert!(len > 0, "a read at or past the object's end");
        self.read = Some(Read {
            slot,
            buf_off,
            len,
            file_offset,
            got: 0,
        });
    }

    /// Whether the connection waits for bytes.
    pub fn reading(&self) -> bool {
        self.read.is_some()
    }

    /// Takes the connection's pending read away (it is cancelled or failed): its slot.
    pub fn take_read(&mut self) -> Option<ArenaSlot> {
        self.read.take().map(|r| r.slot)
    }

    /// Everything that can be done now, in order, into `out` (nothing when one side waits
    /// for the other).
    pub fn run(&mut self, out: &mut Vec<Step>) -> Result<(), RelayError> {
        loop {
            if self.piece.is_some_and(|p| self.used == p.len) {
                self.piece = None;
                out.push(Step::PieceDone);
                continue;
            }
            let (Some(p), Some(r)) = (self.piece, self.read.as_mut()) else {
                return Ok(());
            };
            let piece_at = p.file_offset + self.used as u64;
            let piece_end = p.file_offset + p.len as u64;
            let want_at = r.file_offset + r.got as u64;
            if want_at < piece_at {
                return Err(RelayError::Behind);
            }
            if piece_at < want_at {
                // Bytes of the fetch's first block before the response's range: skipped.
                self.used = (want_at.min(piece_end) - p.file_offset) as usize;
            }
            if self.used == p.len {
                self.piece = None;
                out.push(Step::PieceDone);
                continue;
            }
            let n = (r.len - r.got).min(p.len - self.used);
            out.push(Step::Copy {
                from: p.slot,
                from_off: self.used,
                to: r.slot,
                to_off: r.buf_off + r.got,
                len: n,
            });
            self.used += n;
            r.got += n;
            if r.got == r.len {
                out.push(Step::ReadDone {
                    slot: r.slot,
                    len: r.len,
                });
                self.read = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(raw: u16) -> ArenaSlot {
        ArenaSlot::new(raw)
    }

    /// Runs `relay` and checks every copy against the object (byte i of the object is
    /// `i % 251`): fills `client` (the connection's chunk) from `fetch` (the piece).
    fn run(relay: &mut Relay, fetch: &[u8], client: &mut [u8]) -> Vec<Step> {
        let mut out = Vec::new();
        relay.run(&mut out).unwrap();
        for s in &out {
            if let Step::Copy {
                from_off,
                to_off,
                len,
                ..
            } = *s
            {
                client[to_off..to_off + len].copy_from_slice(&fetch[from_off..from_off + len]);
            }
        }
        out
    }

    fn object(from: u64, len: usize) -> Vec<u8> {
        (from..from + len as u64).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn reads_are_answered_across_pieces_skipping_what_precedes_the_range() {
        // A 1000-byte object; the response wants bytes 300.. in reads of 256; the fetch began
        // at its block's start (0) and delivers pieces of 512 (the last padded to 512).
        let mut relay = Relay::new(7, 1000, 300);
        let mut client = vec![0u8; 256];
        relay.read(a(1), 0, 256, 300);
        assert!(run(&mut relay, &[], &mut client).is_empty(), "no piece yet");
        let first = object(0, 512);
        relay.piece(a(2), 0, 512);
        let steps = run(&mut relay, &first, &mut client);
        assert_eq!(
            steps,
            vec![
                Step::Copy {
                    from: a(2),
                    from_off: 300,
                    to: a(1),
                    to_off: 0,
                    len: 212
                },
                Step::PieceDone
            ]
        );
        let mut second = object(512, 488);
        second.resize(512, 0);
        relay.piece(a(2), 512, 512);
        let steps = run(&mut relay, &second, &mut client);
        assert_eq!(
            steps[1],
            Step::ReadDone {
                slot: a(1),
                len: 256
            }
        );
        assert_eq!(client, object(300, 256));
        // The rest of the object: 1000 - 556 = 444 bytes, and nothing of the padding.
        let mut rest = vec![0u8; 444];
        relay.read(a(3), 0, 444, 556);
        let steps = run(&mut relay, &second, &mut rest);
        // The read completes, and the piece (its padding past the object's end not counted)
        // is used up with it.
        assert_eq!(
            &steps[1..],
            &[
                Step::ReadDone {
                    slot: a(3),
                    len: 444
                },
                Step::PieceDone
            ]
        );
        assert_eq!(rest, object(556, 444));
        assert!(!relay.reading());
    }

    #[test]
    fn a_read_at_an_offset_into_its_slot_is_filled_there() {
        let mut relay = Relay::new(1, 100, 0);
        let mut client = vec![9u8; 60];
        relay.read(a(1), 10, 50, 0);
        relay.piece(a(2), 0, 100);
        let steps = run(&mut relay, &object(0, 100), &mut client);
        assert_eq!(
            steps.last(),
            Some(&Step::ReadDone {
                slot: a(1),
                len: 50
            })
        );
        assert_eq!(&client[..10], &[9u8; 10]);
        assert_eq!(&client[10..], &object(0, 50)[..]);
    }

    #[test]
    fn a_read_past_the_objects_end_gets_the_bytes_there_are() {
        let mut relay = Relay::new(1, 1000, 768);
        let mut client = vec![0u8; 512];
        relay.read(a(1), 0, 512, 768);
        relay.piece(a(2), 768, 232);
        let steps = run(&mut relay, &object(768, 232), &mut client);
        assert_eq!(
            &steps[1..],
            &[
                Step::ReadDone {
                    slot: a(1),
                    len: 232
                },
                Step::PieceDone
            ]
        );
        assert_eq!(&client[..232], &object(768, 232)[..]);
    }

    #[test]
    fn a_read_behind_the_delivered_bytes_is_an_error() {
        let mut relay = Relay::new(1, 100, 0);
        relay.piece(a(2), 50, 50);
        relay.read(a(1), 0, 10, 0);
        assert_eq!(relay.run(&mut Vec::new()), Err(RelayError::Behind));
    }

    #[test]
    fn a_cancelled_read_gives_its_slot_back() {
        let mut relay = Relay::new(1, 100, 0);
        relay.read(a(4), 0, 10, 0);
        assert!(relay.reading());
        assert_eq!(relay.take_read(), Some(a(4)));
        assert!(!relay.reading());
        assert_eq!(relay.take_read(), None);
    }
}
