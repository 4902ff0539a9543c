//! `misses`: requests for files that do not exist, at a fixed rate, as a scanner or a broken
//! client sends them: `--conns` keep-alive connections, each on its own thread, asking for
//! `--prefix<conn>-<n>` (never the same path twice, so no negative cache can answer for the
//! server) on an absolute schedule. Every answer must be a 404.
//!
//!   misses --addr A --rate R --duration-s D [--conns 8] [--prefix /nx/]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use crate::{die, resolve, Args};

/// Reads one response; returns its status. Bodies are read by Content-Length.
fn read_status(r: &mut BufReader<TcpStream>) -> std::io::Result<u16> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(status)
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
                let s = TcpStream::connect(addr).unwrap_or_else(|e| die(&format!("connect: {e}")));
                s.set_nodelay(true).expect("TCP_NODELAY");
                let mut w = s.try_clone().expect("clone");
                let mut r = BufReader::new(s);
                let (mut sent, mut not_found, mut other) = (0u64, 0u64, 0u64);
                // Spread the connections' schedules over one gap.
                let offset = gap.mul_f64(c as f64 / conns as f64);
                while start.elapsed() < duration {
                    let at = start + offset + gap * sent as u32;
                    thread::sleep(at.saturating_duration_since(Instant::now()));
                    let req = format!("GET {prefix}{c}-{sent} HTTP/1.1\r\nHost: localhost\r\n\r\n");
                    if w.write_all(req.as_bytes()).is_err() {
                        break;
                    }
                    sent += 1;
                    match read_status(&mut r) {
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
