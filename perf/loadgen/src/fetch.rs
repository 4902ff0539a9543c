//! `fetch`: N fresh clients at once, each fetching a whole file and then a range of another
//! (every body verified byte for byte), each on its own new connection; completion times.
//! perf/link.sh runs it while stalled or 1-byte/s clients hold the server: what a newcomer
//! waits for.

use std::io;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::{bad, pct, Args, Conn, Verifier, READ_BUF};

struct Want {
    path: String,
    range: Option<(u64, u64)>,
    seed: u64,
    len: u64,
}

/// Fetches one body and checks it; seconds from before connect to the last byte.
fn fetch_one(addr: SocketAddr, w: &Want, deadline: Instant) -> io::Result<f64> {
    let t0 = Instant::now();
    // A stuck server may send nothing for many seconds and then resume: wait up to the deadline.
    let left = deadline
        .saturating_duration_since(t0)
        .max(Duration::from_millis(100));
    let mut c = Conn::connect(&addr, READ_BUF, Some(left))?;
    c.send_get(&w.path, w.range, true)?;
    let h = c.read_head()?;
    let want_status = if w.range.is_some() { 206 } else { 200 };
    if h.status != want_status {
        return Err(bad(&format!("status {}, expected {want_status}", h.status)));
    }
    let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
    if len != w.len {
        return Err(bad(&format!("Content-Length {len}, expected {}", w.len)));
    }
    let mut v = Verifier::new(w.seed, w.range.map_or(0, |r| r.0));
    let mut late = false;
    c.read_body(len, |d| {
        v.feed(d);
        late |= Instant::now() > deadline;
    })?;
    if let Some(at) = v.bad_at {
        return Err(bad(&format!(
            "{}: body differs at file offset {at}",
            w.path
        )));
    }
    if late {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "past the deadline"));
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn parse_range(r: &str) -> (u64, u64) {
    let (s, e) = r
        .split_once('-')
        .unwrap_or_else(|| crate::die("--range wants START-END"));
    let s: u64 = s.parse().unwrap_or_else(|_| crate::die("bad range start"));
    let e: u64 = e.parse().unwrap_or_else(|_| crate::die("bad range end"));
    if e < s {
        crate::die("range end before start");
    }
    (s, e)
}

/// `fetch --addr A --clients N --file-path U --file-seed S --file-len L --range-path U
/// --range START-END --range-seed S [--timeout-s T]`
pub fn cmd_fetch(a: &Args) {
    let addr = crate::resolve(&a.str("addr"));
    let n = a.u64("clients") as usize;
    if n == 0 {
        crate::die("--clients must be at least 1");
    }
    let timeout = a.f64_or("timeout-s", 30.0);
    let (rs, re) = parse_range(&a.str("range"));
    let wants = [
        Want {
            path: a.str("file-path"),
            range: None,
            seed: a.u64("file-seed"),
            len: a.u64("file-len"),
        },
        Want {
            path: a.str("range-path"),
            range: Some((rs, re)),
            seed: a.u64("range-seed"),
            len: re - rs + 1,
        },
    ];
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(timeout);
    let (tx, rx) = mpsc::channel::<(usize, Result<f64, String>)>();
    let wants = std::sync::Arc::new(wants);
    for _ in 0..n {
        let tx = tx.clone();
        let wants = wants.clone();
        thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                for (i, w) in wants.iter().enumerate() {
                    let r = fetch_one(addr, w, deadline).map_err(|e| e.to_string());
                    let failed = r.is_err();
                    if tx.send((i, r)).is_err() || failed {
                        return;
                    }
                }
            })
            .expect("spawn");
    }
    drop(tx);
    let mut secs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut errors = [0u64; 2];
    let mut first_error = None;
    // Stragglers past the deadline are not waited for: they count as not completed.
    while let Ok((i, r)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        match r {
            Ok(s) => secs[i].push(s),
            Err(e) => {
                errors[i] += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    println!("clients={n}");
    println!("timeout_s={timeout:.1}");
    for (i, key) in ["file", "range"].iter().enumerate() {
        let v = &mut secs[i];
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{key}_ok={}", v.len());
        println!("{key}_errors={}", errors[i]);
        println!(
            "{key}_incomplete={}",
            (n as u64).saturating_sub(v.len() as u64 + errors[i])
        );
        if !v.is_empty() {
            println!("{key}_s_p50={:.3}", pct(v, 50.0));
            println!("{key}_s_max={:.3}", v[v.len() - 1]);
        }
        // The figure to compare: when the last of the N was done (the timeout when one was not).
        let all_done = v.len() == n;
        let worst = if all_done { v[v.len() - 1] } else { timeout };
        println!("{key}_s_worst={worst:.3}");
        println!("{key}_all_done={}", all_done as u8);
    }
    if let Some(e) = first_error {
        println!("first_error={e}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}
