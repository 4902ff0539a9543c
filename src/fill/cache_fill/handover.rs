//! A fill's first fetch whose reply the cache may not keep, handed to the request that
//! started it (`FillCore::hand_over`, `CacheFill::claim_handed`).

use crate::origin::contract;
use crate::origin::fetch::HeadFacts;

/// A fill's first fetch whose reply the cache may not keep (`HeadFacts::handed`): it goes
/// on, unstored, for the client that started it, the others of its waiters make their own
/// fetch (or get its 5xx status), and none gets another client's reply (RFC 9111 §3).
#[derive(Debug)]
pub struct Handover<W> {
    /// The fetch's job id: its pieces and end come out as a pass-through's
    /// (`take_pass_through_events`) once `claim_handed`, or it is ended by `drop_handed`.
    pub job: u64,
    /// The waiter it is for (on the fetch's shard); None: nobody can take it (the fetch is
    /// ended).
    pub waiter: Option<W>,
    /// The reply's head.
    pub facts: HeadFacts,
    /// Why it is not stored.
    pub why: contract::NotStored,
    /// The object's byte its first piece starts at (the reply reaches the object's end).
    pub from: u64,
}
