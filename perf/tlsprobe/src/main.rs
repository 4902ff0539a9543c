//! tlsprobe: the figures behind shardline's choice of TLS crypto provider and record layout
//! (`perf/TLS-PROVIDER.md`, written by `perf/tls-provider.sh`). Prints Markdown tables.
//!
//! - `aead`: AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305 sealing 16 KiB records, aws-lc-rs
//!   against ring, best of `ROUNDS`.
//! - `handshakes`: server CPU per TLS 1.3 handshake (full and resumed), by provider, certificate
//!   key and key-exchange group: rustls client and server in one thread, only the server's
//!   calls timed.
//! - `layout`: sealing the records of a 512 KiB arena slot in place (moving each record's
//!   plaintext back to make room for the headers and tags, as `src/tls/record.rs` does), out
//!   of place into a second slot, and in place without the move (the lower bound), over 256 MiB
//!   of slots so that the caches are cold, as the file bytes are after an O_DIRECT read.

use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of plaintext per record: TLS's maximum, what shardline sends by default.
const RECORD_BYTES: usize = 16384;
/// Records sealed per AEAD measurement (320 MiB).
const AEAD_RECORDS: u64 = 20_000;
/// Handshakes per handshake measurement.
const HANDSHAKES: u32 = 1000;
/// Repetitions of each measurement, the compared ones interleaved round by round; the best is
/// reported (the host's other work only slows a round down).
const ROUNDS: usize = 5;
/// Arena slot size and count for `layout` (256 MiB: beyond any cache here).
const SLOT_BYTES: usize = 512 * 1024;
const SLOTS: usize = 512;
/// TLS 1.3 record overhead: 5-byte header, 1-byte content type, 16-byte tag.
const RECORD_OVERHEAD_BYTES: usize = 22;

/// Runs each measurement `ROUNDS` times, interleaved round by round (so that a slow stretch of
/// the host hits all of them alike), and keeps each one's highest figure.
fn best_of(runs: &mut [&mut dyn FnMut() -> f64]) -> Vec<f64> {
    let mut best = vec![f64::MIN; runs.len()];
    for _ in 0..ROUNDS {
        for (b, run) in best.iter_mut().zip(runs.iter_mut()) {
            *b = b.max(run());
        }
    }
    best
}

fn nonce(i: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&i.to_be_bytes());
    n
}

fn aead() {
    println!("| AEAD, 16 KiB records | aws-lc-rs (GB/s) | ring (GB/s) | aws-lc-rs / ring |");
    println!("|---|---:|---:|---:|");
    let aad = [23u8, 3, 3, 64, 17];
    for (name, a, r) in [
        (
            "AES-128-GCM",
            &aws_lc_rs::aead::AES_128_GCM,
            &ring::aead::AES_128_GCM,
        ),
        (
            "AES-256-GCM",
            &aws_lc_rs::aead::AES_256_GCM,
            &ring::aead::AES_256_GCM,
        ),
        (
            "ChaCha20-Poly1305",
            &aws_lc_rs::aead::CHACHA20_POLY1305,
            &ring::aead::CHACHA20_POLY1305,
        ),
    ] {
        let key = vec![1u8; a.key_len()];
        let ka = aws_lc_rs::aead::LessSafeKey::new(
            aws_lc_rs::aead::UnboundKey::new(a, &key).expect("key"),
        );
        let kr = ring::aead::LessSafeKey::new(ring::aead::UnboundKey::new(r, &key).expect("key"));
        let gbs = |t: Instant| {
            (AEAD_RECORDS as f64 * RECORD_BYTES as f64) / t.elapsed().as_secs_f64() / 1e9
        };
        let mut buf_a = vec![7u8; RECORD_BYTES];
        let mut buf_r = vec![7u8; RECORD_BYTES];
        let mut aws_run = || {
            let t = Instant::now();
            for i in 0..AEAD_RECORDS {
                let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(i));
                let aad = aws_lc_rs::aead::Aad::from(aad);
                let tag = ka.seal_in_place_separate_tag(n, aad, &mut buf_a);
                let _ = std::hint::black_box(tag.expect("seal"));
            }
            gbs(t)
        };
        let mut ring_run = || {
            let t = Instant::now();
            for i in 0..AEAD_RECORDS {
                let n = ring::aead::Nonce::assume_unique_for_key(nonce(i));
                let aad = ring::aead::Aad::from(aad);
                let tag = kr.seal_in_place_separate_tag(n, aad, &mut buf_r);
                let _ = std::hint::black_box(tag.expect("seal"));
            }
            gbs(t)
        };
        let b = best_of(&mut [&mut aws_run, &mut ring_run]);
        let (aws, rin) = (b[0], b[1]);
        println!("| {name} | {aws:.2} | {rin:.2} | {:.2} |", aws / rin);
    }
}

fn certificate(
    alg: &'static rcgen::SignatureAlgorithm,
) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let kp = if alg == &rcgen::PKCS_RSA_SHA256 {
        rcgen::KeyPair::generate_rsa_for(alg, rcgen::RsaKeySize::_2048).expect("RSA key")
    } else {
        rcgen::KeyPair::generate_for(alg).expect("key")
    };
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    let cert = params.self_signed(&kp).expect("certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(kp.serialize_der()));
    (vec![cert.der().clone()], key)
}

/// One handshake measurement: a server and a client configuration, and how many of the last
/// round's handshakes resumed.
struct HandshakeBench {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    resumed: u32,
}

fn handshake_bench(
    provider: &CryptoProvider,
    group: &'static dyn SupportedKxGroup,
    alg: &'static rcgen::SignatureAlgorithm,
    resume: bool,
) -> HandshakeBench {
    let (chain, key) = certificate(alg);
    let mut provider = provider.clone();
    provider.kx_groups = vec![group];
    let provider = Arc::new(provider);
    let tls13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    let mut sc = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(tls13)
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain.clone(), key)
        .expect("certificate");
    // Stateless tickets with aws-lc-rs's ticketer for both providers, as shardline issues them.
    sc.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new().expect("ticketer");
    sc.send_tls13_tickets = 1;
    let sc = Arc::new(sc);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(chain[0].clone()).expect("root");
    let mut cc = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(tls13)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        cc.resumption = rustls::client::Resumption::disabled();
    }
    HandshakeBench {
        server: sc,
        client: Arc::new(cc),
        name: ServerName::try_from("localhost").expect("name"),
        resumed: 0,
    }
}

impl HandshakeBench {
    /// `HANDSHAKES` handshakes; minus the server's CPU µs per handshake (so that the best
    /// round is the highest figure).
    fn round(&mut self) -> f64 {
        let mut server = Duration::ZERO;
        self.resumed = 0;
        for _ in 0..HANDSHAKES {
            let mut c = rustls::ClientConnection::new(self.client.clone(), self.name.clone())
                .expect("client");
            let mut s = rustls::ServerConnection::new(self.server.clone()).expect("server");
            loop {
                let mut to_server = Vec::new();
                while c.wants_write() {
                    c.write_tls(&mut to_server).expect("client write");
                }
                let t = Instant::now();
                let mut rd = &to_server[..];
                while !rd.is_empty() {
                    s.read_tls(&mut rd).expect("server read");
                }
                s.process_new_packets().expect("server handshake");
                let mut to_client = Vec::new();
                while s.wants_write() {
                    s.write_tls(&mut to_client).expect("server write");
                }
                server += t.elapsed();
                let mut rd = &to_client[..];
                while !rd.is_empty() {
                    c.read_tls(&mut rd).expect("client read");
                }
                c.process_new_packets().expect("client handshake");
                if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() {
                    break;
                }
            }
            if matches!(s.handshake_kind(), Some(rustls::HandshakeKind::Resumed)) {
                self.resumed += 1;
            }
        }
        -(server.as_secs_f64() * 1e6 / f64::from(HANDSHAKES))
    }
}

fn handshakes() {
    use rustls::crypto::aws_lc_rs::kx_group as aws_kx;
    let aws = rustls::crypto::aws_lc_rs::default_provider();
    let ring = rustls::crypto::ring::default_provider();
    println!("| TLS 1.3 handshake, server CPU (µs) | aws-lc-rs X25519 | ring X25519 | aws-lc-rs / ring | aws-lc-rs X25519MLKEM768 |");
    println!("|---|---:|---:|---:|---:|");
    for (cert, alg) in [
        ("ECDSA P-256", &rcgen::PKCS_ECDSA_P256_SHA256),
        ("ECDSA P-384", &rcgen::PKCS_ECDSA_P384_SHA384),
        ("RSA-2048", &rcgen::PKCS_RSA_SHA256),
    ] {
        for resume in [false, true] {
            let mut a = handshake_bench(&aws, aws_kx::X25519, alg, resume);
            let mut r = handshake_bench(&ring, rustls::crypto::ring::kx_group::X25519, alg, resume);
            let mut p = handshake_bench(&aws, aws_kx::X25519MLKEM768, alg, resume);
            let b = best_of(&mut [&mut || a.round(), &mut || r.round(), &mut || p.round()]);
            let (us_a, us_r, us_p) = (-b[0], -b[1], -b[2]);
            let want = if resume { HANDSHAKES - 1 } else { 0 };
            // A resumed run in which the tickets did not work would measure full handshakes.
            for (who, got) in [
                ("aws-lc-rs", a.resumed),
                ("ring", r.resumed),
                ("aws-lc-rs PQ", p.resumed),
            ] {
                assert!(
                    got >= want,
                    "{cert} {who}: {got} of {HANDSHAKES} resumed, wanted {want}"
                );
            }
            let kind = if resume { "resumed" } else { "full" };
            println!(
                "| {cert}, {kind} | {us_a:.0} | {us_r:.0} | {:.2} | {us_p:.0} |",
                us_a / us_r
            );
        }
    }
}

type Key = aws_lc_rs::aead::LessSafeKey;

fn aad() -> aws_lc_rs::aead::Aad<[u8; 5]> {
    aws_lc_rs::aead::Aad::from([23u8, 3, 3, 0, 0])
}

fn record_nonce(k: usize) -> aws_lc_rs::aead::Nonce {
    aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(k as u64))
}

/// Records per slot, and where record `k`'s plaintext starts before and after the move.
fn records_per_slot() -> usize {
    SLOT_BYTES / (RECORD_BYTES + RECORD_OVERHEAD_BYTES)
}
fn record_at(k: usize) -> (usize, usize) {
    (
        k * RECORD_BYTES,
        k * (RECORD_BYTES + RECORD_OVERHEAD_BYTES) + 5,
    )
}

/// Seconds to seal every slot's records in place, moving each plaintext back first.
fn seal_in_place_moved(key: &Key, arena: &mut [u8]) -> f64 {
    let t = Instant::now();
    for slot in arena.chunks_exact_mut(SLOT_BYTES) {
        for k in (0..records_per_slot()).rev() {
            let (src, dst) = record_at(k);
            slot.copy_within(src..src + RECORD_BYTES, dst);
            slot[dst + RECORD_BYTES] = 23;
            let body = &mut slot[dst..dst + RECORD_BYTES + 1];
            let tag = key
                .seal_in_place_separate_tag(record_nonce(k), aad(), body)
                .expect("seal");
            slot[dst + RECORD_BYTES + 1..dst + RECORD_BYTES + 17].copy_from_slice(tag.as_ref());
        }
    }
    t.elapsed().as_secs_f64()
}

/// Seconds to seal every slot's records into a second arena.
fn seal_out_of_place(key: &Key, arena: &[u8], other: &mut [u8]) -> f64 {
    let t = Instant::now();
    for (from, to) in arena
        .chunks_exact(SLOT_BYTES)
        .zip(other.chunks_exact_mut(SLOT_BYTES))
    {
        for k in 0..records_per_slot() {
            let (src, dst) = record_at(k);
            let (ct, rest) = to[dst..].split_at_mut(RECORD_BYTES);
            let plaintext = &from[src..src + RECORD_BYTES];
            key.seal_out_of_place_scatter(
                record_nonce(k),
                aad(),
                plaintext,
                ct,
                &[23u8],
                &mut rest[..17],
            )
            .expect("seal");
        }
    }
    t.elapsed().as_secs_f64()
}

/// Seconds to seal every slot's records where they lie (no room for headers: a lower bound).
fn seal_in_place_unmoved(key: &Key, arena: &mut [u8]) -> f64 {
    let t = Instant::now();
    for slot in arena.chunks_exact_mut(SLOT_BYTES) {
        for k in 0..records_per_slot() {
            let (src, _) = record_at(k);
            let plaintext = &mut slot[src..src + RECORD_BYTES];
            let tag = key.seal_in_place_separate_tag(record_nonce(k), aad(), plaintext);
            let _ = std::hint::black_box(tag.expect("seal"));
        }
    }
    t.elapsed().as_secs_f64()
}

fn layout() {
    let key = Key::new(
        aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_128_GCM, &[1u8; 16]).expect("key"),
    );
    let mut arena: Vec<u8> = (0..SLOT_BYTES * SLOTS).map(|i| i as u8).collect();
    let mut other = vec![0u8; SLOT_BYTES * SLOTS];
    let gb = (SLOTS * records_per_slot() * RECORD_BYTES) as f64 / 1e9;
    // Interleaved by hand: all three need the arena.
    let mut best = [f64::MIN; 3];
    for _ in 0..ROUNDS {
        best[0] = best[0].max(gb / seal_in_place_moved(&key, &mut arena));
        best[1] = best[1].max(gb / seal_out_of_place(&key, &arena, &mut other));
        best[2] = best[2].max(gb / seal_in_place_unmoved(&key, &mut arena));
    }
    println!("| Sealing a 512 KiB slot's records (AES-128-GCM, aws-lc-rs, 256 MiB of slots) | GB/s of plaintext |");
    println!("|---|---:|");
    println!(
        "| in place, each record's plaintext moved back first (shardline) | {:.2} |",
        best[0]
    );
    println!("| out of place, into a second slot | {:.2} |", best[1]);
    println!(
        "| in place without the move (lower bound; no room for headers) | {:.2} |",
        best[2]
    );
}

fn main() {
    let what: Vec<String> = std::env::args().skip(1).collect();
    let all = what.is_empty();
    let wants = |w: &str| all || what.iter().any(|a| a == w);
    if what
        .iter()
        .any(|a| !["aead", "handshakes", "layout"].contains(&a.as_str()))
    {
        eprintln!("usage: tlsprobe [aead] [handshakes] [layout]  (all three without arguments)");
        std::process::exit(2);
    }
    if wants("aead") {
        aead();
        println!();
    }
    if wants("handshakes") {
        handshakes();
        println!();
    }
    if wants("layout") {
        layout();
        println!();
    }
}
