//! Typed handles for the shard's four kinds of slot, so a connection slot can never be passed
//! where an arena slot, an open-file cache entry or a fixed socket is meant (issue 11 item 4).
//!
//! Each is a plain index with no behaviour; there are deliberately no `From` conversions, so
//! a bare integer only becomes a handle through `new` at the place that allocates it (a free
//! list, a token decode, an accept completion), and only leaves one through `index` (to index
//! a per-slot array) or `raw` (to hand it to a syscall or pack it into a token).

/// A connection slot: an index into the shard's per-connection tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct ConnSlot(u32);

/// A slot of the shard's registered arena (also the registered-buffer index of the ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct ArenaSlot(u16);

/// An open-file cache entry, which is also its slot in the ring's file range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct FileSlot(u32);

/// A fixed-file index holding an accepted socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct SocketSlot(u32);

impl ConnSlot {
    /// Connection slot `raw`.
    pub const fn new(raw: u32) -> ConnSlot {
        ConnSlot(raw)
    }
    /// Its index into per-connection arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
    /// The integer, for a token or an intrusive list.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl ArenaSlot {
    /// Arena slot `raw`.
    pub const fn new(raw: u16) -> ArenaSlot {
        ArenaSlot(raw)
    }
    /// Its index into per-slot arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
    /// The integer, for a token or the registered-buffer index of an SQE.
    pub const fn raw(self) -> u16 {
        self.0
    }
}

impl FileSlot {
    /// File slot `raw`.
    pub const fn new(raw: u32) -> FileSlot {
        FileSlot(raw)
    }
    /// Its index into per-entry arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
    /// The integer, for the ring's file-table update.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl SocketSlot {
    /// Fixed socket `raw`.
    pub const fn new(raw: u32) -> SocketSlot {
        SocketSlot(raw)
    }
    /// Its index into per-socket arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
    /// The integer, for `types::Fixed` of an SQE or a token.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

// Shown as the bare number, so log lines and assertion messages read as before.
impl std::fmt::Display for ConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for ArenaSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for FileSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for SocketSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
