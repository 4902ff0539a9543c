//! The `user_data` token: what a completion belongs to, encoded and decoded in one place.
//!
//! Layout (64 bits): `op:8 | aux:16 | generation:16 | slot:24`. `op` is never 0, so 0 is never
//! a valid token. `slot` is the connection slot, `generation` guards against a slot reused
//! while a stale completion is still queued, `aux` carries the arena slot of chunk operations.
//! The fields stay integers only inside this module: tokens are built from and read back as
//! typed handles (`ConnSlot`, `ArenaSlot`, `SocketSlot`).

use super::slots::{ArenaSlot, ConnSlot, SocketSlot};

/// Largest connection slot index a token can carry.
pub const MAX_SLOT: u32 = (1 << 24) - 1;

/// What an operation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Multishot accept on the shard's listener.
    Accept = 1,
    /// Receive into a provided buffer.
    Recv = 2,
    /// Send of the connection's header buffer.
    SendHead = 3,
    /// File read into an arena slot (aux = arena slot).
    Read = 4,
    /// Send from an arena slot (aux = arena slot).
    SendChunk = 5,
    /// Close of a connection's socket.
    Close = 6,
    /// Cancel of a connection's operations.
    Cancel = 7,
    /// Canned 503 for a connection over the cap (slot = fixed socket index).
    Overflow = 8,
    /// Close after the canned 503 (slot = fixed socket index).
    OverflowClose = 9,
    /// Cancel of the listener's accept during drain.
    CancelAccept = 10,
    /// Write of the shard's access-log buffer.
    LogWrite = 11,
    /// One-shot poll for a connection's socket to become writable.
    PollOut = 12,
    /// Shutdown of a connection's write side (lingering close).
    Shutdown = 13,
    /// Multishot accept on the shard's TLS listener.
    AcceptTls = 14,
    /// Send of TLS bytes the session produced, from the header buffer.
    SendTls = 15,
    /// The peer-address request of a new connection (`SO_PEERNAME`).
    PeerName = 16,
    /// The operation in flight of an origin fetch (slot = fetch index).
    Origin = 17,
    /// The poll on the shard's fill eventfd: another shard's fetch has notices for it.
    FillWake = 18,
    /// Cancel of a connection's multishot receive (its unread bytes reached their bound).
    CancelRecv = 19,
    /// The background scrub's read of a cached block (`shard::scrub`).
    Scrub = 20,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Accept,
            2 => Op::Recv,
            3 => Op::SendHead,
            4 => Op::Read,
            5 => Op::SendChunk,
            6 => Op::Close,
            7 => Op::Cancel,
            8 => Op::Overflow,
            9 => Op::OverflowClose,
            10 => Op::CancelAccept,
            11 => Op::LogWrite,
            12 => Op::PollOut,
            13 => Op::Shutdown,
            14 => Op::AcceptTls,
            15 => Op::SendTls,
            16 => Op::PeerName,
            17 => Op::Origin,
            18 => Op::FillWake,
            19 => Op::CancelRecv,
            20 => Op::Scrub,
            _ => return None,
        })
    }
}

/// A decoded `user_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// What the operation was.
    pub op: Op,
    /// Connection slot (or fixed socket index for overflow ops).
    slot: u32,
    /// Generation of the slot when the operation was submitted.
    pub generation: u16,
    /// Op-specific extra (arena slot for chunk ops).
    aux: u16,
}

impl Token {
    /// A token for an operation of the shard itself (accept, log write): no slot.
    pub fn shard(op: Op) -> Token {
        Token::new(op, 0, 0, 0)
    }

    /// A token for `op` of connection `conn` at `generation`.
    pub fn conn(op: Op, conn: ConnSlot, generation: u16) -> Token {
        Token::new(op, conn.raw(), generation, 0)
    }

    /// A token for a chunk operation (read, send) of connection `conn` on arena slot `slot`.
    pub fn chunk(op: Op, conn: ConnSlot, generation: u16, slot: ArenaSlot) -> Token {
        Token::new(op, conn.raw(), generation, slot.raw())
    }

    /// A token for `op` on a socket that has no connection slot (over the cap).
    pub fn socket(op: Op, socket: SocketSlot) -> Token {
        Token::new(op, socket.raw(), 0, 0)
    }

    /// A token for the operation in flight of origin fetch `fetch` at `generation`.
    pub fn fetch(fetch: u32, generation: u16) -> Token {
        Token::new(Op::Origin, fetch, generation, 0)
    }

    /// The origin fetch an `Op::Origin` operation belongs to.
    pub fn fetch_index(self) -> u32 {
        self.slot
    }

    /// The connection slot the operation belongs to.
    pub fn conn_slot(self) -> ConnSlot {
        ConnSlot::new(self.slot)
    }

    /// The arena slot of a chunk operation.
    pub fn arena_slot(self) -> ArenaSlot {
        ArenaSlot::new(self.aux)
    }

    /// The raw fields packed as they are (the typed constructors above call it).
    fn new(op: Op, slot: u32, generation: u16, aux: u16) -> Token {
        assert!(slot <= MAX_SLOT, "slot {slot} does not fit a token");
        Token {
            op,
            slot,
            generation,
            aux,
        }
    }

    /// Packs the token into `user_data`.
    pub fn encode(self) -> u64 {
        (self.op as u64) << 56
            | u64::from(self.aux) << 40
            | u64::from(self.generation) << 24
            | u64::from(self.slot)
    }

    /// Unpacks `user_data`; None for 0 or an unknown op (a bug worth counting, not a crash).
    pub fn decode(user_data: u64) -> Option<Token> {
        let op = Op::from_u8((user_data >> 56) as u8)?;
        Some(Token {
            op,
            aux: (user_data >> 40) as u16,
            generation: (user_data >> 24) as u16,
            slot: (user_data & u64::from(MAX_SLOT)) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_field() {
        let ops = [
            Op::Accept,
            Op::Recv,
            Op::SendHead,
            Op::Read,
            Op::SendChunk,
            Op::Close,
            Op::Cancel,
            Op::Overflow,
            Op::OverflowClose,
            Op::CancelAccept,
            Op::LogWrite,
            Op::PollOut,
            Op::Shutdown,
            Op::AcceptTls,
            Op::SendTls,
            Op::PeerName,
            Op::Origin,
            Op::FillWake,
            Op::CancelRecv,
        ];
        for op in ops {
            for (slot, generation, aux) in [(0, 0, 0), (MAX_SLOT, u16::MAX, u16::MAX), (7, 3, 9)] {
                let t = Token::new(op, slot, generation, aux);
                let raw = t.encode();
                assert_ne!(raw, 0);
                assert_eq!(Token::decode(raw), Some(t));
            }
        }
    }

    #[test]
    fn zero_and_unknown_ops_are_rejected() {
        assert_eq!(Token::decode(0), None);
        assert_eq!(Token::decode(0xff << 56), None);
    }

    #[test]
    #[should_panic]
    fn oversized_slot_panics() {
        let _ = Token::new(Op::Recv, MAX_SLOT + 1, 0, 0);
    }

    proptest::proptest! {
        #[test]
        fn any_token_round_trips(slot in 0..=MAX_SLOT, generation: u16, aux: u16, op in 1u8..=18) {
            let op = Op::from_u8(op).unwrap();
            let t = Token::new(op, slot, generation, aux);
            proptest::prop_assert_eq!(Token::decode(t.encode()), Some(t));
        }
    }
}
