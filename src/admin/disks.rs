//! The cache's disks on the admin listener (issue 43), behind the admin token like every
//! `/cache/` endpoint: `GET /cache/disks` (each disk's slot, state, id, directory, errors by
//! kind and bytes used, and those left out at start-up), `POST /cache/disks/offline?disk=D`
//! and `POST /cache/disks/online?disk=D`, where D is a disk's directory (as in `cache_dirs`)
//! or its slot. `shardline cache disk status|offline|online` asks them.

use super::{Reply, State};
use crate::cache::disk_health::ErrorKind;
use crate::fill::edge::SharedEdge;

/// `GET /cache/disks`: one line per disk, then one per disk left out.
pub(super) fn status(state: &State) -> Reply {
    let Some(edge) = state.edge.as_ref() else {
        return Reply::text(404, "no pull-through cache here (no [[origin]])\n");
    };
    let Some(report) = edge.disks() else {
        return super::cache_loading();
    };
    let mut out = String::new();
    for (slot, d) in report.disks.iter().enumerate() {
        let errors: Vec<String> = ErrorKind::ALL
            .iter()
            .map(|k| format!("{}={}", k.label(), report.health.errors(slot, *k)))
            .collect();
        let used = report
            .used_bytes(slot)
            .map_or("?".to_string(), |b| b.to_string());
        out.push_str(&format!(
            "{slot} {} id={:016x} dir={} errors={} used_bytes={used}\n",
            report.health.state(slot).label(),
            d.id,
            d.dir.display(),
            errors.join(","),
        ));
    }
    for m in &report.missing {
        out.push_str(&format!(
            "- left-out dir={} error={}\n",
            m.dir.display(),
            m.error.replace('\n', " ")
        ));
    }
    Reply::text(200, &out)
}

/// `POST /cache/disks/offline?disk=D` (`offline`) or `/online?disk=D`.
pub(super) fn set(query: Option<&[u8]>, state: &State, offline: bool) -> Reply {
    let Some(edge) = state.edge.as_ref() else {
        return Reply::text(404, "no pull-through cache here (no [[origin]])\n");
    };
    let Some(disk) = crate::http::request::query_param(query.unwrap_or_default(), "disk") else {
        return Reply::text(400, "give disk=DIR (as in cache_dirs) or disk=SLOT\n");
    };
    let Some(disk) = crate::fs::resolve::percent_decode(disk) else {
        return Reply::text(400, "disk= is not percent-encoded right\n");
    };
    let disk = String::from_utf8_lossy(&disk).into_owned();
    let Some(slot) = slot_of(edge, &disk) else {
        return Reply::text(
            404,
            &format!("no disk {disk} was opened at start-up (GET /cache/disks lists them)\n"),
        );
    };
    let Some(report) = edge.disks() else {
        return super::cache_loading();
    };
    let d = &report.disks[slot];
    if !offline {
        return online(edge, slot);
    }
    report.health.set_offline(slot);
    // The lock's release takes an offline disk's objects out of the index now.
    drop(crate::fill::cache_fill::lock(&edge.core));
    let marked = crate::cache::disks::mark_offline(&d.dir, true);
    tracing::warn!(disk = %d.dir.display(), slot, state = "offline", "cache disk set by the operator");
    match marked {
        Ok(()) => Reply::text(200, &format!("{} offline\n", d.dir.display())),
        Err(e) => Reply::text(
            200,
            &format!(
                "{} offline (until a restart: the disk did not take its marker: {e})\n",
                d.dir.display()
            ),
        ),
    }
}

/// `online` of disk `slot`: the disk opened at start-up, or a blank replacement mounted in its
/// place (it takes the old one's id and share). The cache's I/O thread reopens it (no disk
/// I/O on this thread: the disk may still stall) and brings it online; this waits
/// `ONLINE_WAIT` for the outcome, then answers 202 (queued: ask again for the outcome).
fn online(edge: &SharedEdge, slot: usize) -> Reply {
    let Some(report) = edge.disks() else {
        return super::cache_loading();
    };
    let d = &report.disks[slot];
    let mut outcome = crate::fill::cache_fill::lock(&edge.core).reopen_outcome(slot);
    if outcome.is_none() {
        if report.health.usable(slot) {
            return Reply::text(200, &format!("{} online (it was)\n", d.dir.display()));
        }
        crate::fill::cache_fill::lock(&edge.core).reopen_disk(slot, &d.dir, d.id);
        let deadline = std::time::Instant::now() + ONLINE_WAIT;
        while outcome.is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(ONLINE_POLL_MS));
            outcome = crate::fill::cache_fill::lock(&edge.core).reopen_outcome(slot);
        }
    }
    let dir = d.dir.display();
    match outcome {
        None => Reply::text(202, &format!("{dir}: being brought online; ask again\n")),
        Some(Err(why)) => Reply::text(409, &format!("{dir}: not online: {why}\n")),
        Some(Ok(blank)) => {
            let word = if blank {
                "online (a blank replacement: it took the old disk's id and share)"
            } else {
                "online"
            };
            tracing::warn!(disk = %dir, slot, state = word, "cache disk set by the operator");
            Reply::text(200, &format!("{dir} {word}\n"))
        }
    }
}

/// Longest an `online` request waits for its outcome before it answers 202 (the admin
/// listener's one thread waits with it).
const ONLINE_WAIT: std::time::Duration = std::time::Duration::from_millis(300);
/// How often it looks (ms).
const ONLINE_POLL_MS: u64 = 10;

/// The slot of the disk `disk` names: its directory, or its slot number.
fn slot_of(edge: &SharedEdge, disk: &str) -> Option<usize> {
    let disks = &edge.disks()?.disks;
    if let Ok(slot) = disk.parse::<usize>() {
        return (slot < disks.len()).then_some(slot);
    }
    let want = std::path::Path::new(disk);
    disks
        .iter()
        .position(|d| d.dir == want || d.dir.canonicalize().ok().as_deref() == Some(want))
}
