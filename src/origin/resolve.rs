//! Origin names resolved off the shard threads: one resolver thread looks every name up
//! (through the system resolver, `getaddrinfo`) and again after `ttl`, and publishes the
//! addresses; shards read the latest set without waiting. A lookup that fails keeps the last
//! good addresses, so a resolver outage does not stop fills that already know where to go.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest the resolver sleeps between checks of its stop flag (a drop also wakes it).
const STOP_POLL_MS: u64 = 50;

/// What is known of one name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The addresses of the last lookup that succeeded (empty before the first).
    pub addrs: Vec<SocketAddr>,
    /// The error of the last lookup, if it failed.
    pub last_error: Option<String>,
    /// Lookups made so far.
    pub lookups: u64,
}

/// A name lookup: the system resolver (`system_lookup`), or a test's.
pub type Lookup = fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// The system resolver (`getaddrinfo`).
pub fn system_lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

/// The published addresses of every name (shared by the resolver and the shards).
#[derive(Debug)]
pub struct Addresses {
    names: Vec<(String, u16)>,
    lookup: Lookup,
    current: Mutex<Vec<Arc<Resolved>>>,
    /// Bumped at every publication, so a shard compares one integer per tick.
    epoch: AtomicU64,
}

impl Addresses {
    /// The latest of name `i` (as given to `spawn`).
    pub fn get(&self, i: usize) -> Arc<Resolved> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())[i].clone()
    }

    /// Publications so far.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Looks every name up once and publishes the results.
    fn refresh(&self) {
        for (i, (host, port)) in self.names.iter().enumerate() {
            let old = self.get(i);
            let mut next = Resolved {
                lookups: old.lookups + 1,
                ..(*old).clone()
            };
            match (self.lookup)(host, *port) {
                Ok(found) if !found.is_empty() => {
                    next.addrs = found;
                    next.last_error = None;
                }
                Ok(_) => next.last_error = Some("no address".into()),
                // Keep the last good addresses.
                Err(e) => next.last_error = Some(e.to_string()),
            }
            self.current.lock().unwrap_or_else(|e| e.into_inner())[i] = Arc::new(next);
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// The resolver thread; stops (and is joined) when dropped.
pub struct Resolver {
    addresses: Arc<Addresses>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Resolver {
    /// Resolves `names` (host, port) now, then again every `ttl` on its own thread.
    pub fn spawn(names: Vec<(String, u16)>, ttl: Duration) -> std::io::Result<Resolver> {
        Resolver::spawn_with(names, ttl, system_lookup)
    }

    /// As `spawn`, looking names up with `lookup`.
    pub fn spawn_with(
        names: Vec<(String, u16)>,
        ttl: Duration,
        lookup: Lookup,
    ) -> std::io::Result<Resolver> {
        let addresses = Arc::new(Addresses {
            current: Mutex::new(vec![Arc::default(); names.len()]),
            names,
            lookup,
            epoch: AtomicU64::new(0),
        });
        addresses.refresh();
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (addresses.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("shardline-resolve".into())
            .spawn(move || {
                let step = Duration::from_millis(STOP_POLL_MS);
                let mut waited = Duration::ZERO;
                while !s.load(Ordering::Acquire) {
                    // Parked, not asleep: a drop unparks it, so stopping takes no poll step.
                    let started = std::time::Instant::now();
                    std::thread::park_timeout(step.min(ttl));
                    waited += started.elapsed();
                    if waited >= ttl {
                        waited = Duration::ZERO;
                        a.refresh();
                    }
                }
            })?;
        Ok(Resolver {
            addresses,
            stop,
            thread: Some(thread),
        })
    }

    /// The published addresses.
    pub fn addresses(&self) -> Arc<Addresses> {
        self.addresses.clone()
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn names_resolve_at_once_and_again_after_the_ttl_and_a_failure_is_reported() {
        let r = Resolver::spawn(
            vec![
                ("localhost".into(), 8080),
                // Refused before any query (a NUL cannot be in a name): no DNS server needed.
                ("no\0such-host".into(), 80),
            ],
            Duration::from_millis(100),
        )
        .unwrap();
        let a = r.addresses();
        let first = a.get(0);
        assert!(first
            .addrs
            .iter()
            .any(|s| s.ip().is_loopback() && s.port() == 8080));
        let bad = a.get(1);
        assert!(bad.addrs.is_empty() && bad.last_error.is_some(), "{bad:?}");
        // Looked up again after the TTL, off this thread (a publication covers every name).
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.epoch() < 3 {
            assert!(Instant::now() < deadline, "no lookup after the TTL");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(a.get(0).lookups >= 3 && a.get(1).lookups >= 3);
        assert_eq!(a.get(0).addrs, first.addrs);
        drop(r); // joins the thread
    }
}
