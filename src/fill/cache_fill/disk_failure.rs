//! A cache disk taken to failing (`cache::disk_health`): its objects leave the index, so their
//! next requests are misses, filled again on the other disks (placement skips a failing disk);
//! the operator's `online` hands its reopened journal over (`reopen_disk`).

use super::*;

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// Takes the objects of every disk newly failing out of the index, once per disk: each
    /// current version is retired (dropped once nothing reads or fills it), every other one
    /// not read is dropped. Their Drop records go nowhere (`Journals` writes nothing to a
    /// failing disk) and their files stay: once `online` takes it off the lists of failed disks
    /// (`cache::failed_disks`), a restart finds them.
    pub(super) fn drop_failed_disks(&mut self) {
        let failed = self.store.health().take_newly_failed();
        if failed == 0 {
            return;
        }
        let on_failed = |v: u64| failed & (1 << crate::cache::version_id::slot_of(v).min(63)) != 0;
        let versions: Vec<(u64, bool)> = self
            .index
            .each_version_id()
            .filter(|&v| on_failed(v))
            .map(|v| (v, self.index.is_current(v)))
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

    /// Queues the operator's `online` of disk `slot` at `dir` (its id `id`) for whoever
    /// appends: the I/O thread reopens it (`Journals::reopen`) and brings it online (inline,
    /// it is done here). Whether it was queued now (false: one is under way).
    pub fn reopen_disk(&mut self, slot: usize, dir: &std::path::Path, id: u64) -> bool {
        let Some(io) = self.signals.io.clone() else {
            if let Some(journals) = self.journal.as_mut() {
                let outcome = journals.reopen(slot, dir, id);
                if outcome.is_ok() {
                    self.store.health().set_online(slot);
                }
                self.reopen_outcomes.push((slot, outcome));
            }
            return true;
        };
        let mut reopen = io
            .reopen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !reopen.ask(slot, dir, id) {
            return false;
        }
        drop(reopen);
        let _ = rustix::io::write(&io.wake, &1u64.to_ne_bytes());
        true
    }

    /// Disk `slot`'s `online` outcome, if one is in (told once): true when it was blank.
    pub fn reopen_outcome(&mut self, slot: usize) -> Option<Result<bool, String>> {
        match self.signals.io.as_ref() {
            Some(io) => io
                .reopen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take_outcome(slot),
            None => {
                let i = self.reopen_outcomes.iter().position(|o| o.0 == slot)?;
                Some(self.reopen_outcomes.swap_remove(i).1)
            }
        }
    }

    /// Fetch `job` was given up at its disk's deadline with its operation in the kernel
    /// (`Filler::park`): the disk holds it until `released` (and stays stalled as long).
    pub(super) fn given_up(&mut self, job: u64) {
        if let Some(j) = self.running.get(&job) {
            let disk = crate::cache::version_id::slot_of(j.version);
            self.store.health().op_held(disk);
            self.given_up.insert(job, disk);
        }
    }

    /// The operation of given-up fetch `job` came back.
    pub(super) fn released(&mut self, job: u64) {
        if let Some(disk) = self.given_up.remove(&job) {
            self.store.health().op_back(disk, unix_now_s());
        }
    }
}
