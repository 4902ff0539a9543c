//! A cache disk taken to failing (`cache::disk_health`): its objects leave the index, so their
//! next requests are misses, filled again on the other disks (placement skips a failing disk);
//! the operator's `online` hands its reopened journal over (`reopen_disk`).

use super::*;

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// Takes the objects of every disk newly failing out of the index, once per disk: each
    /// current version is retired (dropped once nothing reads or fills it), every other one
    /// not read is dropped. Their Drop records go nowhere (`Journals` writes nothing to a
    /// failing disk) and their files stay, so a restart with the disk healthy again finds them.
    pub(super) fn drop_failed_disks(&mut self) {
        let failed = self.store.health().take_newly_failed();
        if failed == 0 {
            return;
        }
        let on_failed = |v: u64| failed & (1 << crate::cache::version_id::slot_of(v).min(63)) != 0;
        let versions: Vec<(u64, bool)> = self
            .index
            .each_version()
            .filter(|m| on_failed(m.version))
            .map(|m| (m.version, self.index.is_current(m.version)))
            .collect();
        let mut drop = Vec::new();
        for &(version, current) in &versions {
            if current {
                self.retire(version);
            } else if !self.pins.contains_key(&version) && !self.retired.contains(&version) {
                drop.push(version);
            }
        }
        self.drop_versions(&drop, false);
        tracing::warn!(
            disks = format!("{failed:#x}"),
            versions = versions.len(),
            "cache disk failing: its objects left the index (misses now, filled on the other disks)"
        );
    }

    /// Hands disk `slot`'s reopened journal (`cache::disks::reopen_disk`, the operator's
    /// `online`) to whoever appends: the I/O thread swaps it in and then brings the disk
    /// online (inline, it is done here).
    pub fn reopen_disk(&mut self, slot: usize, journal: crate::cache::journal_file::JournalFile) {
        if let Some(io) = self.signals.io.as_ref() {
            io.reopened
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((slot, journal));
            let _ = rustix::io::write(&io.wake, &1u64.to_ne_bytes());
        } else if let Some(journals) = self.journal.as_mut() {
            if let Ok(true) = journals.replace(slot, journal) {
                self.store.health().set_online(slot);
            }
        }
    }
}
