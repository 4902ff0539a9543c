//! One cache disk's worker thread (issue 43, stalls): every blocking operation on the disk's
//! journal and data directory (appends with their sync, compactions, data-file creates) runs
//! on it, one at a time, and its caller waits with a deadline (`cache_disk_op_timeout_ms`).
//! An operation past the deadline is given up: the disk is noted stalled
//! (`DiskHealth::note` with ETIMEDOUT), the operation stays with the thread until the disk
//! lets it finish (counted by `DiskHealth::op_held`), and nothing more is sent to the disk
//! meanwhile. So a frozen disk blocks only its own thread: the I/O thread, the other disks
//! and the shards go on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use super::disk_health::DiskHealth;
use super::journal_file::JournalFile;

/// What a job sends back.
pub type Outcome = Box<dyn std::any::Any + Send>;
/// An operation on the disk, run on its thread with its journal.
pub type Job = Box<dyn FnOnce(&mut JournalFile) -> Outcome + Send>;

/// A disk's thread and the one operation it may have outstanding.
#[derive(Debug)]
pub struct DiskWorker {
    slot: usize,
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Outcome>,
    /// The journal's length, as the thread last left it.
    len: Arc<AtomicU64>,
    /// A job was given up at its deadline and has not come back.
    stuck: bool,
    health: Arc<DiskHealth>,
    /// Tests: the next job waits for this first (a disk that stalls, then answers).
    #[cfg(test)]
    hold: Option<mpsc::Receiver<()>>,
}

impl DiskWorker {
    /// Starts disk `slot`'s thread, owning `journal`.
    pub fn spawn(
        slot: usize,
        mut journal: JournalFile,
        health: Arc<DiskHealth>,
    ) -> std::io::Result<DiskWorker> {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel::<Outcome>();
        let len = Arc::new(AtomicU64::new(journal.len()));
        let thread_len = len.clone();
        std::thread::Builder::new()
            .name(format!("cache-disk-{slot}"))
            .spawn(move || {
                for job in job_rx {
                    let out = job(&mut journal);
                    thread_len.store(journal.len(), Ordering::Release);
                    if done_tx.send(out).is_err() {
                        return;
                    }
                }
            })?;
        Ok(DiskWorker {
            slot,
            jobs,
            done,
            len,
            stuck: false,
            health,
            #[cfg(test)]
            hold: None,
        })
    }

    /// Sends `job` to the thread; false when the disk still holds a given-up job (or the
    /// thread is gone): the job is not run.
    pub fn send(&mut self, job: Job) -> bool {
        if self.stuck && !self.poll() {
            return false;
        }
        #[cfg(test)]
        let job: Job = match self.hold.take() {
            Some(hold) => Box::new(move |journal: &mut JournalFile| {
                let _ = hold.recv();
                job(journal)
            }),
            None => job,
        };
        if self.jobs.send(job).is_err() {
            self.health.fail(self.slot, "its worker thread ended");
            return false;
        }
        true
    }

    /// Tests: the next job sent stalls until `release` is sent to (or dropped).
    #[cfg(test)]
    pub fn stall_next(&mut self) -> mpsc::Sender<()> {
        let (release, hold) = mpsc::channel();
        self.hold = Some(hold);
        release
    }

    /// Waits until `deadline` for the job `send` started. None: the deadline passed (the disk
    /// is noted stalled; the job finishes when the disk lets it, and nothing is sent until
    /// then), or the thread is gone.
    pub fn wait(&mut self, deadline: Instant) -> Option<Outcome> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.done.recv_timeout(left) {
            Ok(out) => Some(out),
            Err(RecvTimeoutError::Timeout) => {
                self.stuck = true;
                self.health.op_held(self.slot);
                self.health
                    .note(self.slot, libc::ETIMEDOUT, super::disk_health::unix_now_s());
                None
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.health.fail(self.slot, "its worker thread ended");
                None
            }
        }
    }

    /// Whether the thread is free: a given-up job that has come back since is taken (its
    /// outcome dropped: its caller gave up on it) and counted back.
    pub fn poll(&mut self) -> bool {
        if !self.stuck {
            return true;
        }
        match self.done.try_recv() {
            Err(TryRecvError::Empty) => return false,
            Ok(_) => {}
            Err(TryRecvError::Disconnected) => {
                self.health.fail(self.slot, "its worker thread ended");
            }
        }
        self.stuck = false;
        self.health
            .op_back(self.slot, super::disk_health::unix_now_s());
        true
    }

    /// The journal's bytes.
    pub fn journal_bytes(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }
}
