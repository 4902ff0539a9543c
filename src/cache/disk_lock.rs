//! One process per cache disk: an exclusive `flock` on `<disk>/lock`, held as long as the
//! disk's journal is open.
//!
//! Two processes on one disk would both number new versions from the same highest id, write
//! each other's data files and interleave their journal records: a restart could then find a
//! key pointing at another object's blocks. A restart handover (`systemctl start
//! shardline@b` while `@a` drains) runs two processes on the same cache for a while, so the
//! newcomer waits for the lock (`fill::edge::SharedEdge::open_loading`) instead of failing.
//! The holder's pid is written into the file, for the message of whoever waits.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::load_progress::LoadProgress;

/// The lock file in each disk's directory.
pub const LOCK_FILE: &str = "lock";

/// The held lock of one disk (released when dropped, or when the process ends however it
/// ends: the kernel drops a `flock` with its last descriptor).
#[derive(Debug)]
pub struct DiskLock {
    _file: File,
    identity: LockIdentity,
}

/// Which lock file a held lock is on (its file system and inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockIdentity {
    dev: u64,
    ino: u64,
}

impl LockIdentity {
    /// Whether `dir`'s lock file is this one (the same disk: a replacement mounted in its
    /// place has another).
    pub fn is_of(&self, dir: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir.join(LOCK_FILE))
            .is_ok_and(|m| (m.dev(), m.ino()) == (self.dev, self.ino))
    }
}

/// Why a disk's lock was not taken.
#[derive(Debug)]
pub enum NotLocked {
    /// Another open of the lock file holds it: the pid written there (None: unreadable).
    Held(Option<u32>),
    /// The lock file could not be opened or locked.
    Io(io::Error),
}

impl std::fmt::Display for NotLocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotLocked::Held(Some(pid)) => write!(f, "in use by process {pid} ({LOCK_FILE} held)"),
            NotLocked::Held(None) => write!(f, "in use by another process ({LOCK_FILE} held)"),
            NotLocked::Io(e) => write!(f, "{LOCK_FILE}: {e}"),
        }
    }
}

impl From<NotLocked> for io::Error {
    fn from(e: NotLocked) -> io::Error {
        match e {
            NotLocked::Held(_) => io::Error::new(io::ErrorKind::WouldBlock, e.to_string()),
            NotLocked::Io(err) => io::Error::new(err.kind(), format!("{LOCK_FILE}: {err}")),
        }
    }
}

impl DiskLock {
    /// Takes disk `dir`'s lock without waiting, and writes this process's pid into it.
    pub fn try_take(dir: &Path) -> Result<DiskLock, NotLocked> {
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(NotLocked::Io)?;
        match rustix::fs::flock(
            file.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(NotLocked::Held(holder_pid(&mut file)))
            }
            Err(e) => return Err(NotLocked::Io(e.into())),
        }
        // The pid is a courtesy for the waiter's message: a failed write does not matter.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        let identity = {
            use std::os::unix::fs::MetadataExt;
            let m = file.metadata().map_err(NotLocked::Io)?;
            LockIdentity {
                dev: m.dev(),
                ino: m.ino(),
            }
        };
        Ok(DiskLock {
            _file: file,
            identity,
        })
    }

    /// Which lock file it holds.
    pub fn identity(&self) -> LockIdentity {
        self.identity
    }
}

/// How often a waiting loader tries the locks again (`wait_for_locks`).
pub const LOCK_POLL_MS: u64 = 50;

/// Takes the lock of each of `dirs`, waiting while another process holds one (a restart
/// handover's predecessor, until its drain ends), with the disks waited for counted in
/// `progress`. A disk whose lock file cannot be opened gets None: opening it reports why.
pub fn wait_for_locks(dirs: &[PathBuf], progress: &LoadProgress) -> Vec<Option<DiskLock>> {
    let mut locks: Vec<Option<DiskLock>> = dirs.iter().map(|_| None).collect();
    let mut settled = vec![false; dirs.len()];
    let mut told = vec![false; dirs.len()];
    loop {
        let mut waiting = 0;
        for (at, dir) in dirs.iter().enumerate() {
            if settled[at] {
                continue;
            }
            match DiskLock::try_take(dir) {
                Ok(lock) => (locks[at], settled[at]) = (Some(lock), true),
                Err(NotLocked::Io(_)) => settled[at] = true,
                Err(held @ NotLocked::Held(_)) => {
                    waiting += 1;
                    if !std::mem::replace(&mut told[at], true) {
                        tracing::warn!(
                            disk = %dir.display(),
                            holder = %held,
                            "cache disk in use by another process: waiting for it (pulled \
                             requests pass through meanwhile)"
                        );
                    }
                }
            }
        }
        progress.set_waiting_disks(waiting);
        if waiting == 0 {
            return locks;
        }
        std::thread::sleep(std::time::Duration::from_millis(LOCK_POLL_MS));
    }
}

/// The pid written in a held lock file.
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_is_locked_once_until_its_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let held = DiskLock::try_take(dir.path()).unwrap();
        // A second open, even in the same process, is refused and told who holds it.
        match DiskLock::try_take(dir.path()) {
            Err(NotLocked::Held(pid)) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("the second take should be refused: {other:?}"),
        }
        let err = io::Error::from(DiskLock::try_take(dir.path()).unwrap_err());
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(err.to_string().contains("in use by process"), "{err}");
        assert!(held.identity().is_of(dir.path()));
        let other = tempfile::tempdir().unwrap();
        let theirs = DiskLock::try_take(other.path()).unwrap();
        assert!(!held.identity().is_of(other.path()));
        drop(theirs);
        drop(held);
        let again = DiskLock::try_take(dir.path()).expect("free once dropped");
        drop(again);
        // A directory that is not there is an I/O error, not "held".
        let gone = dir.path().join("missing");
        assert!(matches!(DiskLock::try_take(&gone), Err(NotLocked::Io(_))));
    }

    #[test]
    fn a_loader_waits_for_a_held_disk_and_leaves_an_unopenable_one_to_the_open() {
        let held_dir = tempfile::tempdir().unwrap();
        let free_dir = tempfile::tempdir().unwrap();
        let dirs = vec![
            held_dir.path().to_path_buf(),
            free_dir.path().to_path_buf(),
            free_dir.path().join("missing"),
        ];
        let held = DiskLock::try_take(&dirs[0]).unwrap();
        let progress = std::sync::Arc::new(LoadProgress::default());
        let waiter = {
            let (dirs, progress) = (dirs.clone(), progress.clone());
            std::thread::spawn(move || wait_for_locks(&dirs, &progress))
        };
        // It waits for the held one, counted; the state, not a time, says so.
        while progress.figures().2 != 1 {
            assert!(!waiter.is_finished(), "it should wait for the held disk");
            std::thread::yield_now();
        }
        assert!(!waiter.is_finished());
        drop(held);
        let locks = waiter.join().unwrap();
        assert!(locks[0].is_some() && locks[1].is_some() && locks[2].is_none());
        assert_eq!(progress.figures().2, 0);
        // Both taken are held: another take is refused.
        assert!(matches!(
            DiskLock::try_take(&dirs[1]),
            Err(NotLocked::Held(_))
        ));
    }
}
