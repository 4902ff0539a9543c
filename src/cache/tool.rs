//! `shardline cache stats|verify`: what a cache directory holds, and whether every block the
//! journal vouches for still reads back with its checksum. Read-only: the journal is replayed
//! from a copy of its bytes (never truncated), so it is safe beside a running server.

use std::path::Path;

use super::journal;
use super::store::{BlockStore, ReadError};

/// What a cache directory holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys with a current version.
    pub objects: usize,
    /// Versions held (current, or older ones not yet dropped).
    pub versions: usize,
    /// Blocks on disk that the journal vouches for.
    pub blocks: u64,
    /// Bytes of those blocks.
    pub bytes: u64,
    /// Bytes of the objects' sizes (what a complete cache of them would hold).
    pub object_bytes: u64,
    /// Bytes of the journal.
    pub journal_bytes: u64,
    /// The journal ends in a torn or damaged tail (ignored, as at start-up).
    pub damaged_tail: bool,
    /// Whole records replay refuses (skipped, as at start-up).
    pub refused_records: u64,
}

fn replay(dir: &Path) -> std::io::Result<(super::index::Index, journal::ReplayStats, u64)> {
    let bytes = std::fs::read(dir.join("journal"))?;
    let (index, stats) = journal::replay(&bytes);
    Ok((index, stats, bytes.len() as u64))
}

/// The cache in `dir`, counted.
pub fn stats(dir: &Path) -> std::io::Result<Stats> {
    let (index, replay, journal_bytes) = replay(dir)?;
    let mut s = Stats {
        objects: index.keys(),
        versions: index.versions(),
        journal_bytes,
        damaged_tail: replay.damaged_tail,
        refused_records: replay.refused,
        ..Stats::default()
    };
    for v in index.each_version() {
        s.object_bytes += v.size;
        for (b, _) in index.each_block(v.version) {
            s.blocks += 1;
            s.bytes += BlockStore::block_len(&v, b).unwrap_or(0) as u64;
        }
    }
    Ok(s)
}

/// Reads every block the journal of `dir` vouches for and checks it; returns the blocks
/// (version, block) that fail, and how many were checked.
pub fn verify(dir: &Path) -> std::io::Result<(u64, Vec<(u64, u32)>)> {
    let (index, _, _) = replay(dir)?;
    let store = BlockStore::open(dir)?;
    let mut buf = Vec::new();
    let (mut checked, mut bad) = (0, Vec::new());
    for v in index.each_version() {
        for (b, crc) in index.each_block(v.version) {
            checked += 1;
            match store.read_block(&v, b, crc, &mut buf) {
                Ok(()) => {}
                Err(ReadError::Corrupt) | Err(ReadError::OutOfRange) => bad.push((v.version, b)),
                Err(ReadError::Io(e)) => return Err(e),
            }
        }
    }
    bad.sort_unstable();
    Ok((checked, bad))
}

/// Longest reply read from the admin listener to a purge.
const PURGE_REPLY_MAX_BYTES: u64 = 4096;
/// How long a purge may take over the admin listener.
const PURGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Times a request the admin listener answered 429 (over `admin_control_per_s`) is sent again.
const RATE_LIMITED_RETRIES_MAX: u32 = 60;
/// Longest wait before sending a 429'd request again (whatever its Retry-After says).
const RETRY_AFTER_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// A running server's admin listener, and the bearer token its control endpoints want
/// (`admin_token_file`; None sends none, and control requests are refused).
#[derive(Clone)]
pub struct AdminClient {
    /// The admin listener's address.
    pub addr: std::net::SocketAddr,
    token: Option<String>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("AdminClient")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| ".."))
            .finish()
    }
}

impl AdminClient {
    /// The admin listener at `addr`, sending `token` with every request.
    pub fn new(addr: std::net::SocketAddr, token: Option<String>) -> AdminClient {
        AdminClient { addr, token }
    }

    /// The admin listener at `addr`, with the token of `token_file` (read as the server reads
    /// it: a file others may read is refused); no file, no token.
    pub fn with_token_file(
        addr: std::net::SocketAddr,
        token_file: Option<&Path>,
    ) -> Result<AdminClient, String> {
        let token = token_file
            .map(crate::fs::secret::read_token_file)
            .transpose()?;
        Ok(AdminClient::new(addr, token))
    }

    /// One request: its status and body. A 429 is waited out (its Retry-After, at most
    /// `RETRY_AFTER_MAX`) and sent again, up to `RATE_LIMITED_RETRIES_MAX` times.
    pub fn request(&self, method: &str, target: &str) -> std::io::Result<(u16, String)> {
        let mut tries = 0;
        loop {
            let (status, retry_after, body) = self.request_once(method, target)?;
            if status != 429 || tries == RATE_LIMITED_RETRIES_MAX {
                return Ok((status, body));
            }
            tries += 1;
            std::thread::sleep(retry_after.min(RETRY_AFTER_MAX));
        }
    }

    fn request_once(
        &self,
        method: &str,
        target: &str,
    ) -> std::io::Result<(u16, std::time::Duration, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&self.addr, PURGE_TIMEOUT)?;
        s.set_read_timeout(Some(PURGE_TIMEOUT))?;
        s.set_write_timeout(Some(PURGE_TIMEOUT))?;
        let auth = match &self.token {
            Some(t) => format!("Authorization: Bearer {t}\r\n"),
            None => String::new(),
        };
        let request = format!(
            "{method} {target} HTTP/1.1\r\nHost: shardline\r\n{auth}Connection: close\r\n\r\n"
        );
        s.write_all(request.as_bytes())?;
        let mut reply = Vec::new();
        s.take(PURGE_REPLY_MAX_BYTES).read_to_end(&mut reply)?;
        let text = String::from_utf8_lossy(&reply);
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP reply");
        let status = text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse().ok())
            .ok_or_else(bad)?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let retry_after = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("retry-after")
                    .then(|| v.trim().parse::<u64>().ok())?
            })
            .map_or(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs,
            );
        Ok((status, retry_after, body.trim_end().to_string()))
    }
}

/// Asks the running server whose admin listener is `admin` to purge `path` (one object) or,
/// when `prefix`, everything beneath it: `POST /cache/purge`. Returns the reply's status and
/// body (`purged N`).
pub fn purge(admin: &AdminClient, path: &str, prefix: bool) -> std::io::Result<(u16, String)> {
    let name = if prefix { "prefix" } else { "path" };
    admin.request(
        "POST",
        &format!("/cache/purge?{name}={}", query_encode(path)),
    )
}

/// Asks the running server whose admin listener is `admin` to purge every object its origin
/// tagged `tag` (`POST /cache/purge?tag=`). Returns the reply's status and body (`purged N`).
pub fn purge_tag(admin: &AdminClient, tag: &str) -> std::io::Result<(u16, String)> {
    admin.request("POST", &format!("/cache/purge?tag={}", query_encode(tag)))
}

/// `shardline cache disk status` (`disk` None) or `offline|online DISK` through a running
/// server's admin listener (`GET /cache/disks`, `POST /cache/disks/offline|online?disk=`).
pub fn disk(
    admin: &AdminClient,
    action: &str,
    disk: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let Some(d) = disk else {
        return admin.request("GET", "/cache/disks");
    };
    let target = format!("/cache/disks/{action}?disk={}", query_encode(d));
    // An `online` the server is still carrying out answers 202: asked again, it answers with
    // the outcome once it is in.
    let deadline = std::time::Instant::now() + DISK_ONLINE_WAIT;
    loop {
        let (status, body) = admin.request("POST", &target)?;
        if status != 202 || std::time::Instant::now() >= deadline {
            return Ok((status, body));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Longest `shardline cache disk online` asks again while the server answers 202.
pub const DISK_ONLINE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `path` with every byte but unreserved ones and '/' percent-encoded (a query value).
pub fn query_encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purge_path_is_query_encoded() {
        assert_eq!(
            query_encode("/pull/a b&c=d%.bin"),
            "/pull/a%20b%26c%3Dd%25.bin"
        );
        assert_eq!(query_encode("/x/Y-1_2.~z/"), "/x/Y-1_2.~z/");
    }
    use crate::cache::index::ObjectVersion;
    use crate::cache::journal::Record;
    use crate::cache::journal_file::JournalFile;

    #[test]
    fn stats_count_and_verify_finds_a_damaged_block() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlockStore::open(dir.path()).unwrap();
        let (mut journal, _, _) = JournalFile::open(&dir.path().join("journal")).unwrap();
        let meta = ObjectVersion {
            key: b"k".to_vec(),
            version: 1,
            size: 3 * 65536 + 10,
            block_bytes: 65536,
            fetched_unix_s: 0,
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        };
        let mut records = vec![Record::Object(meta.clone())];
        for b in [0u32, 1, 3] {
            let len = BlockStore::block_len(&meta, b).unwrap();
            let bytes: Vec<u8> = (0..len).map(|i| (i as u32 ^ b) as u8).collect();
            let crc = store.write_block(&meta, b, &bytes).unwrap();
            records.push(Record::Block {
                version: 1,
                block: b,
                crc,
            });
        }
        journal.append(&records, true).unwrap();
        let s = stats(dir.path()).unwrap();
        assert_eq!((s.objects, s.versions, s.blocks), (1, 1, 3));
        assert_eq!(s.bytes, 2 * 65536 + 10);
        assert_eq!(s.object_bytes, meta.size);
        assert_eq!(verify(dir.path()).unwrap(), (3, vec![]));
        // One byte of block 1 flipped on disk.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(store.data_path(1))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xff], 65536 + 5).unwrap();
        assert_eq!(verify(dir.path()).unwrap(), (3, vec![(1, 1)]));
    }
}
