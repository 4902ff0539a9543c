//! `hellos`: connections that each send the first bytes of a large ClientHello and stall, as
//! an attacker holds a server's handshake memory: `--conns` connections, each writing
//! `--send-bytes` of a ClientHello that announces `--announce-bytes` (in records of 16 KiB,
//! legacy_version TLS 1.2, the body zeros), then holding them `--hold-s`. At the end, how many
//! the server still holds open and how many it closed.
//!
//!   hellos --addr A --conns N --announce-bytes X --send-bytes B --hold-s S [--ready-file F]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use crate::{die, resolve, Args};

/// Plaintext bytes per record of the ClientHello.
const RECORD_BYTES: usize = 16 * 1024;

/// The first `send` bytes of a ClientHello whose handshake body is `announce` bytes.
pub fn hello_bytes(announce: usize, send: usize) -> Vec<u8> {
    let mut msg = vec![1u8];
    msg.extend_from_slice(&(announce as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&[3, 3]);
    msg.resize(4 + announce, 0);
    let mut out = Vec::with_capacity(send + 64);
    for piece in msg.chunks(RECORD_BYTES) {
        out.extend_from_slice(&[0x16, 3, 1]);
        out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
        out.extend_from_slice(piece);
        if out.len() >= send {
            break;
        }
    }
    out.truncate(send);
    out
}

pub fn cmd_hellos(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let conns = a.u64("conns") as usize;
    let announce = a.u64("announce-bytes") as usize;
    let send = a.u64("send-bytes") as usize;
    let hold = Duration::from_secs_f64(a.f64("hold-s"));
    if announce >= 1 << 24 {
        die("--announce-bytes must be below 16 MiB (a 24-bit length)");
    }
    let bytes = hello_bytes(announce, send);
    let mut socks = Vec::with_capacity(conns);
    let mut send_errors = 0u64;
    for _ in 0..conns {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| die(&format!("connect: {e}")));
        s.set_write_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        if s.write_all(&bytes).is_err() {
            send_errors += 1;
        }
        socks.push(s);
    }
    if let Some(f) = a.opt_str("ready-file") {
        std::fs::write(&f, "sent\n").unwrap_or_else(|e| die(&format!("--ready-file {f}: {e}")));
    }
    thread::sleep(hold);
    let (mut open, mut closed) = (0u64, 0u64);
    for s in &mut socks {
        s.set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => open += 1,
            _ => closed += 1,
        }
    }
    println!("conns={conns}");
    println!("sent_bytes_each={}", bytes.len());
    println!("send_errors={send_errors}");
    println!("still_open={open}");
    println!("closed_by_server={closed}");
}

#[cfg(test)]
mod tests {
    use super::hello_bytes;

    #[test]
    fn a_hello_prefix_is_records_of_one_handshake_message() {
        let b = hello_bytes(100 * 1024, 65536);
        assert_eq!(b.len(), 65536);
        assert_eq!(&b[..5], &[0x16, 3, 1, 0x40, 0x00]);
        assert_eq!(&b[5..11], &[1, 0x01, 0x90, 0x00, 3, 3]);
        // The second record's header follows the first 16 KiB.
        assert_eq!(&b[5 + 16384..5 + 16384 + 5], &[0x16, 3, 1, 0x40, 0x00]);
    }
}
