//! `flood`: a ClientHello flood, as an attacker sends one: an open loop of connections at
//! `--rate` per second, each writing the same ClientHello (made once by rustls, so the client
//! does no cryptography at all) and holding the connection until the server answers with its
//! first flight (it did the key exchange and the signature) or `--hold-ms` passes, then closing.
//! One epoll thread, like `swarm`, so the offered rate does not depend on how slowly the server
//! answers.
//!
//!   flood --addr A --rate R --duration-s D [--warmup-s W] [--hold-ms 2000] [--max-open N]

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::swarm::{
    epoll_create1, epoll_ctl, epoll_wait, start_connect, EpollEvent, EPOLLERR, EPOLLET, EPOLLHUP,
    EPOLLIN, EPOLLOUT, EPOLLRDHUP, EPOLL_CTL_ADD,
};
use crate::Args;

/// Bytes of the server's answer that count as "it did the work" (a ServerHello record with
/// its key share and the encrypted rest of the flight is well over this).
const ANSWER_BYTES: usize = 100;

struct Attempt {
    s: TcpStream,
    started: Instant,
    sent: bool,
    got: usize,
}

pub fn cmd_flood(a: &Args) {
    let Some((cfg, name)) = crate::tls::client() else {
        crate::die("flood needs --tls 1");
    };
    let addr = crate::resolve(&a.str("addr"));
    let rate = a.f64("rate");
    let duration = a.f64("duration-s");
    let warmup = a.f64_or("warmup-s", 1.0);
    let hold = Duration::from_millis(a.opt_u64("hold-ms").unwrap_or(2000));
    let max_open = a.opt_u64("max-open").unwrap_or(20_000) as usize;
    let hello = {
        let mut c = rustls::ClientConnection::new(cfg.clone(), name.clone())
            .unwrap_or_else(|e| crate::die(&format!("TLS: {e}")));
        let mut out = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut out)
                .unwrap_or_else(|e| crate::die(&format!("TLS: {e}")));
        }
        out
    };
    // SAFETY: plain syscall.
    let epfd = unsafe { epoll_create1(0o2000000) };
    if epfd < 0 {
        crate::die(&format!("epoll_create1: {}", io::Error::last_os_error()));
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(duration);
    let window = start + Duration::from_secs_f64(warmup);
    let mut open: HashMap<u64, Attempt> = HashMap::new();
    let mut order: VecDeque<(Instant, u64)> = VecDeque::new();
    let mut next_id = 0u64;
    let (mut attempts, mut answered, mut refused, mut timed_out, mut skipped) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut events = vec![EpollEvent { events: 0, data: 0 }; 1024];
    let mut buf = [0u8; 4096];
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut next_at = start;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let counting = now >= window;
        // Start every attempt that is due (open loop: late ones are not skipped, only past
        // the open-socket bound).
        while next_at <= now {
            next_at += interval;
            if open.len() >= max_open {
                skipped += u64::from(counting);
                continue;
            }
            attempts += u64::from(counting);
            match start_connect(&addr, 0) {
                Ok(s) => {
                    let id = next_id;
                    next_id += 1;
                    let mut ev = EpollEvent {
                        events: EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                        data: id,
                    };
                    // SAFETY: valid epoll and socket descriptors; `ev` outlives the call.
                    unsafe { epoll_ctl(epfd, EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) };
                    open.insert(
                        id,
                        Attempt {
                            s,
                            started: now,
                            sent: false,
                            got: 0,
                        },
                    );
                    order.push_back((now, id));
                }
                Err(_) => refused += u64::from(counting),
            }
        }
        // Holds that ran out.
        while let Some(&(t, id)) = order.front() {
            if now.saturating_duration_since(t) < hold {
                break;
            }
            order.pop_front();
            if open.remove(&id).is_some() {
                timed_out += u64::from(counting);
            }
        }
        let wait_ms = next_at
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(10) as i32;
        // SAFETY: `events` has room for its length.
        let n = unsafe { epoll_wait(epfd, events.as_mut_ptr(), events.len() as i32, wait_ms) };
        for ev in events.iter().take(n.max(0) as usize) {
            let (id, flags) = (ev.data, ev.events);
            let Some(at) = open.get_mut(&id) else {
                continue;
            };
            if !at.sent && flags & EPOLLOUT != 0 {
                at.sent = at.s.write_all(&hello).is_ok();
            }
            let mut done = false;
            if flags & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR) != 0 {
                loop {
                    match at.s.read(&mut buf) {
                        Ok(0) => {
                            done = true;
                            break;
                        }
                        Ok(k) => at.got += k,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            done = true;
                            break;
                        }
                    }
                }
            }
            let counts = at.started >= window;
            if at.got >= ANSWER_BYTES {
                answered += u64::from(counts);
                open.remove(&id);
            } else if done {
                refused += u64::from(counts);
                open.remove(&id);
            }
        }
    }
    let secs = end
        .saturating_duration_since(window)
        .as_secs_f64()
        .max(1e-9);
    println!("window_s={secs:.3}");
    println!("attempts_per_s={:.0}", attempts as f64 / secs);
    println!("answered_per_s={:.0}", answered as f64 / secs);
    println!("refused_per_s={:.0}", refused as f64 / secs);
    println!("timed_out_per_s={:.0}", timed_out as f64 / secs);
    println!("skipped_per_s={:.0}", skipped as f64 / secs);
    let _ = io::stdout().flush();
    std::process::exit(0);
}
