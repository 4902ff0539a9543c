//! How a version id names its disk (issue 43): the top `64 - SLOT_SHIFT` bits are the slot of
//! the disk that holds it (its place among the disks opened at start-up), the rest a number
//! counted over every disk. So a shard finds a version's data file from its id alone, with no
//! lock. The slot is not stored as such: replay gives each record of a disk's journal that
//! disk's slot now (`rebase`), so reordering `cache_dirs` moves nothing. Versions of one disk
//! (a single `cache_dir`) are slot 0: their ids and file names are what they always were.

use super::record::Record;

/// Bits of a version id below its disk's slot.
pub const SLOT_SHIFT: u32 = 56;
/// The id's number, without its slot.
const NUMBER_MASK: u64 = (1 << SLOT_SHIFT) - 1;

/// The slot of the disk that holds `version`.
pub fn slot_of(version: u64) -> usize {
    (version >> SLOT_SHIFT) as usize
}

/// `version`'s number on disk `slot`.
pub fn on_slot(version: u64, slot: usize) -> u64 {
    (version & NUMBER_MASK) | ((slot as u64) << SLOT_SHIFT)
}

/// The number a version's data file is named by (its id without the slot).
pub fn file_number(version: u64) -> u64 {
    version & NUMBER_MASK
}

/// The version a record is about.
pub fn record_version(record: &Record) -> u64 {
    match record {
        Record::Object(meta) => meta.version,
        Record::Block { version, .. }
        | Record::Blocks { version, .. }
        | Record::Drop { version }
        | Record::Fresh { version, .. } => *version,
    }
}

/// `record` read from the journal of the disk in slot `slot`: its version moved there.
pub fn rebase(mut record: Record, slot: usize) -> Record {
    match &mut record {
        Record::Object(meta) => meta.version = on_slot(meta.version, slot),
        Record::Block { version, .. }
        | Record::Blocks { version, .. }
        | Record::Drop { version }
        | Record::Fresh { version, .. } => *version = on_slot(*version, slot),
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_rides_in_the_top_bits_and_slot_zero_changes_nothing() {
        assert_eq!(on_slot(42, 0), 42);
        assert_eq!(slot_of(42), 0);
        let v = on_slot(42, 3);
        assert_eq!((slot_of(v), file_number(v)), (3, 42));
        // Moved to another slot, the number stays.
        assert_eq!(on_slot(v, 1), on_slot(42, 1));
        let r = rebase(Record::Drop { version: v }, 5);
        assert_eq!(record_version(&r), on_slot(42, 5));
    }
}
