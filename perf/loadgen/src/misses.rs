//! `misses`: requests for files that do not exist, at a fixed rate, as a scanner or a broken
//! client sends them: `--conns` keep-alive connections, each on its own thread, asking for
//! `--prefix<conn>-<n>` (never the same path twice, so no negative cache can answer for the
//! server) on an absolute schedule. Every answer must be a 404.
//!
//!   misses --addr A --rate R --duration-s D [--conns 8] [--prefix /nx/]

use std::thread;
use std::time::{Duration, Instant};

use crate::{die, resolve, Args, Conn};

/// Reads one response with loadgen's client (`Conn`); returns its status.
fn read_status(conn: &mut Conn) -> std::io::Result<u16> {
    let head = conn.read_head()?;
    conn.read_body(head.content_length.unwrap_or(0), |_| {})?;
    Ok(head.status)
}

pub fn cmd_misses(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let rate = a.f64("rate");
    let duration = Duration::from_secs_f64(a.f64("duration-s"));
    let conns = a.opt_u64("conns").unwrap_or(8).max(1) as usize;
    let prefix = a.opt_str("prefix").unwrap_or_else(|| "/nx/".to_string());
    if rate <= 0.0 {
        die("--rate must be positive");
    }
    let gap = Duration::from_secs_f64(conns as f64 / rate);
    let start = Instant::now();
    let workers: Vec<_> = (0..conns)
        .map(|c| {
            let prefix = prefix.clone();
            thread::spawn(move || {
                let mut conn = Conn::connect(&addr, 4096, None)
                    .unwrap_or_else(|e| die(&format!("connect: {e}")));
                let (mut sent, mut not_found, mut other) = (0u64, 0u64, 0u64);
                // Spread the connections' schedules over one gap.
                let offset = gap.mul_f64(c as f64 / conns as f64);
                while start.elapsed() < duration {
                    let at = start + offset + gap * sent as u32;
                    thread::sleep(at.saturating_duration_since(Instant::now()));
                    if conn
                        .send_get(&format!("{prefix}{c}-{sent}"), None, false)
                        .is_err()
                    {
                        break;
                    }
                    sent += 1;
                    match read_status(&mut conn) {
                        Ok(404) => not_found += 1,
                        Ok(_) => other += 1,
                        Err(_) => break,
                    }
                }
                (sent, not_found, other)
            })
        })
        .collect();
    let (mut sent, mut not_found, mut other) = (0u64, 0u64, 0u64);
    for w in workers {
        let (s, n, o) = w.join().expect("worker");
        sent += s;
        not_found += n;
        other += o;
    }
    let secs = start.elapsed().as_secs_f64();
    println!("sent={sent}");
    println!("not_found={not_found}");
    println!("other={other}");
    println!("rate_per_s={:.0}", not_found as f64 / secs);
}
