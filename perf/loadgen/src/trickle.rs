//! `trickle`: many connections each send most of a large request head at once, then its last
//! bytes one at a time with a pause between them (TCP_NODELAY: one byte per segment). What a
//! slow-head attacker costs the server per byte it sends; the response must still arrive whole.
//!
//! Two send patterns. By default every gap sends one byte to each connection in a burst, so
//! the server finds the bytes of all connections in one wake-up. With `--spread 1` the
//! connections' bytes are spaced evenly within each gap (connection `j` sends at
//! `k * gap + j * gap / conns`), as independent clients would: the server is woken for
//! nearly every byte, which is what a byte costs it when it cannot batch.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use crate::{die, resolve, Args};

/// A request head of exactly `total` bytes for `path`: padding fields of about 400 bytes each (40 for 15 KB: under shardline's 64 fields)
/// (under every server's per-line limit), then the empty line.
pub fn padded_head(path: &str, total: usize) -> Vec<u8> {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n").into_bytes();
    if total < head.len() + 2 {
        die(&format!(
            "--head-bytes {total} is shorter than the request line and Host"
        ));
    }
    let mut i = 0;
    // Each padding line is "X-Pad-<i>: <a...>\r\n"; the last one takes what remains.
    while head.len() + 2 < total {
        let name = format!("X-Pad-{i}: ");
        let room = total - 2 - head.len();
        let line_len = if room >= 800 { 400 } else { room };
        if line_len < name.len() + 3 {
            // Too little room for another line: lengthen the previous one instead.
            let at = head.len() - 2;
            head.splice(at..at, std::iter::repeat_n(b'a', room));
            break;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend(std::iter::repeat_n(b'a', line_len - name.len() - 2));
        head.extend_from_slice(b"\r\n");
        i += 1;
    }
    head.extend_from_slice(b"\r\n");
    assert_eq!(head.len(), total, "padded head length");
    head
}

pub fn cmd_trickle(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let path = a.str("path");
    let conns = a.u64("conns") as usize;
    let head_bytes = a.u64("head-bytes") as usize;
    let tail_bytes = a.u64("tail-bytes") as usize;
    let gap = Duration::from_micros((a.f64("gap-ms") * 1000.0) as u64);
    let spread = a.opt_u64("spread").unwrap_or(0) != 0;
    if tail_bytes > head_bytes {
        die("--tail-bytes must not exceed --head-bytes");
    }
    let head = padded_head(&path, head_bytes);
    let split = head_bytes - tail_bytes;
    let mut socks = Vec::with_capacity(conns);
    for _ in 0..conns {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| die(&format!("connect: {e}")));
        s.set_nodelay(true).expect("TCP_NODELAY");
        s.write_all(&head[..split])
            .unwrap_or_else(|e| die(&format!("first part: {e}")));
        socks.push(s);
    }
    if spread {
        fine_timer_slack();
    }
    let start = Instant::now();
    let mut send_errors = 0u64;
    let per_conn = gap / conns.max(1) as u32;
    for (k, &byte) in head[split..].iter().enumerate() {
        let at = start + gap * k as u32;
        thread::sleep(at.saturating_duration_since(Instant::now()));
        for (j, s) in socks.iter_mut().enumerate() {
            if spread {
                let due = at + per_conn * j as u32;
                thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            if s.write_all(&[byte]).is_err() {
                send_errors += 1;
            }
        }
    }
    let trickle_s = start.elapsed().as_secs_f64();
    // Every connection must now get its response's status line.
    let mut ok = 0u64;
    let mut bad = 0u64;
    let mut first_bad = None;
    for s in &mut socks {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < 12 {
            match s.read(&mut buf[got..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        if buf[..got].starts_with(b"HTTP/1.1 200") {
            ok += 1;
        } else {
            bad += 1;
            first_bad.get_or_insert_with(|| String::from_utf8_lossy(&buf[..got]).into_owned());
        }
    }
    println!("conns={conns}");
    println!("head_bytes={head_bytes}");
    println!("tail_bytes={tail_bytes}");
    println!("trickle_s={trickle_s:.3}");
    println!("send_errors={send_errors}");
    println!("ok={ok}");
    println!("bad={bad}");
    if let Some(b) = first_bad {
        println!("first_bad={b:?}");
    }
}

/// Timer slack of 1 µs for the main thread, which sends the trickle (the default 50 µs would
/// bunch the spread sends into bursts of several); best effort: a refusal leaves the default.
fn fine_timer_slack() {
    let _ = std::fs::write("/proc/self/timerslack_ns", "1000");
}

#[cfg(test)]
mod tests {
    use super::padded_head;

    #[test]
    fn padded_heads_have_the_asked_length_and_end() {
        for total in [100usize, 1000, 15_000, 15_001, 16_383] {
            let h = padded_head("/small.bin", total);
            assert_eq!(h.len(), total);
            assert!(h.ends_with(b"\r\n\r\n"));
            let text = String::from_utf8(h).unwrap();
            assert!(text.lines().all(|l| l.len() <= 1200), "{total}");
        }
    }
}
