//! HTTPS with real clients against the real binary: curl, wget, aria2c and Python's `ssl`,
//! `openssl s_client` (TLS 1.2 and 1.3, SNI, ALPN, resumption), rustls; every body compared
//! byte for byte. Then what an edge meets: a second process resuming the first one's tickets,
//! certificates reloaded under load, wrong protocols on both ports, bad records, a ClientHello
//! at one byte a second, a handshake flood over the queue's bound, and clean closes that say
//! so (close_notify).

mod common;

use common::tls::{run_bounded, s_client, tool, Key, Pki, TlsConn};
use common::{
    admin_metric, assert_direct_bytes_sent, pattern_range, read_response, send_signal,
    write_pattern_file, Server,
};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Above `direct_io_min_bytes`: read with O_DIRECT, sealed in place.
const BIG: u64 = 24 << 20;
const SMALL: u64 = 1000;

fn root() -> tempfile::TempDir {
    let dir = common::disk_tempdir();
    write_pattern_file(&dir.path().join("big.bin"), BIG);
    write_pattern_file(&dir.path().join("small.bin"), SMALL);
    dir
}

fn pki_with_localhost() -> (Pki, Vec<(std::path::PathBuf, std::path::PathBuf)>) {
    let pki = Pki::new();
    let leaf = pki.leaf("localhost", &["localhost", "127.0.0.1"], Key::EcdsaP256, 30);
    (pki, vec![leaf])
}

fn wait_for_log(server: &Server, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if server.log().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn tls_port(server: &Server) -> SocketAddr {
    server
        .tls_addr
        .expect("the server announced its HTTPS address")
}

fn assert_file(path: &Path, start: u64, len: u64, what: &str) {
    let got = std::fs::read(path).unwrap_or_default();
    assert_eq!(got.len() as u64, len, "{what}: length");
    assert!(
        got == pattern_range(start, len as usize),
        "{what}: bytes differ from the file"
    );
}

#[test]
fn curl_wget_aria2_python_and_rustls_get_every_byte() {
    let dir = root();
    let (pki, certs) = pki_with_localhost();
    let cfg = pki.config(&certs, "");
    let (server, admin) =
        common::start_tls_with_admin(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let addr = tls_port(&server);
    let port = addr.port();
    let out = tempfile::tempdir().unwrap();
    let ca = pki.ca.to_str().unwrap();
    let url = |path: &str| format!("https://localhost:{port}{path}");
    let resolve = format!("localhost:{port}:127.0.0.1");

    // curl: whole file over TLS 1.3 and 1.2, an unaligned range, a small file.
    let curl = tool("curl", "curl");
    for (name, extra) in [
        ("13", &["--tlsv1.3"][..]),
        ("12", &["--tlsv1.2", "--tls-max", "1.2"][..]),
    ] {
        let dest = out.path().join(format!("curl-{name}"));
        let o = run_bounded(
            Command::new(&curl)
                .args(["-sS", "--fail", "--cacert", ca, "--resolve", &resolve])
                .args(extra)
                .arg("-o")
                .arg(&dest)
                .arg(url("/big.bin")),
            Duration::from_secs(60),
        );
        assert!(
            o.status.success(),
            "curl TLS {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_file(&dest, 0, BIG, &format!("curl TLS {name}"));
    }
    let dest = out.path().join("curl-range");
    let o = run_bounded(
        Command::new(&curl)
            .args([
                "-sS",
                "--fail",
                "--cacert",
                ca,
                "--resolve",
                &resolve,
                "-r",
                "1000001-9000000",
                "-o",
            ])
            .arg(&dest)
            .arg(url("/big.bin")),
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "curl range: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_file(&dest, 1_000_001, 8_000_000, "curl range");

    // wget, then a resume of a partial file (Range from where it stopped).
    let wget = tool("wget", "wget");
    let dest = out.path().join("wget");
    std::fs::write(&dest, pattern_range(0, 3_000_000)).unwrap();
    let o = run_bounded(
        Command::new(&wget)
            .args(["-q", "-c", &format!("--ca-certificate={ca}"), "-O"])
            .arg(&dest)
            .arg(url("/big.bin")),
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "wget -c: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_file(&dest, 0, BIG, "wget resumed");

    // aria2c with 16 connections, stopped part-way at a slow rate, then resumed (-c).
    let aria = tool("aria2c", "aria2");
    let aria_dir = out.path().join("aria");
    std::fs::create_dir_all(&aria_dir).unwrap();
    let aria_args = |slow: bool| {
        let mut c = Command::new(&aria);
        c.args([
            "-x16",
            "-s16",
            "-k1M",
            "-c",
            "--file-allocation=none",
            "--auto-file-renaming=false",
        ])
        .arg(format!("--ca-certificate={ca}"))
        .arg("-d")
        .arg(&aria_dir)
        .args([
            "-o",
            "big.bin",
            "--summary-interval=0",
            "--console-log-level=warn",
        ]);
        if slow {
            c.arg("--max-overall-download-limit=2M");
        }
        c.arg(url("/big.bin"));
        c
    };
    let first = run_bounded(&mut aria_args(true), Duration::from_secs(3));
    let partial = std::fs::metadata(aria_dir.join("big.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        !first.status.success() && aria_dir.join("big.bin.aria2").exists(),
        "aria2c was to be stopped part-way (it left {partial} bytes): {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let o = run_bounded(&mut aria_args(false), Duration::from_secs(60));
    assert!(
        o.status.success(),
        "aria2c -c: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_file(&aria_dir.join("big.bin"), 0, BIG, "aria2c -x16 resumed");

    // Python's ssl on one kept-alive connection: small, range, whole.
    let py = tool("python3", "python3");
    let script = format!(
        r#"
import http.client, ssl, sys
ctx = ssl.create_default_context(cafile={ca:?})
c = http.client.HTTPSConnection("localhost", {port}, context=ctx)
def pat(start, n):
    return bytes(((i * 7 + i // 4093) & 0xff) for i in range(start, start + n))
for path, hdrs, start, n, status in [("/small.bin", {{}}, 0, {SMALL}, 200),
                                     ("/big.bin", {{"Range": "bytes=5000-70000"}}, 5000, 65001, 206),
                                     ("/big.bin", {{}}, 0, {BIG}, 200)]:
    c.request("GET", path, headers=hdrs)
    r = c.getresponse()
    body = r.read()
    assert r.status == status, (path, r.status)
    assert len(body) == n, (path, len(body))
    if n <= 70000:
        assert body == pat(start, n), path
    else:
        import hashlib
        want = hashlib.sha256()
        step = 1 << 20
        for off in range(0, n, step):
            want.update(pat(off, min(step, n - off)))
        assert hashlib.sha256(body).digest() == want.digest(), path
print("python ok", c.sock.version(), c.sock.cipher()[0])
"#
    );
    let o = run_bounded(
        Command::new(&py).arg("-c").arg(&script),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains("python ok"),
        "python ssl: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // rustls, TLS 1.3 and 1.2, several requests on one connection.
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let cc = std::sync::Arc::new(pki.client_config(versions));
        let mut conn = TlsConn::connect(addr, cc, "localhost").unwrap();
        for (range, start, len) in [(None, 0, SMALL), (Some("bytes=4095-8193"), 4095, 4099)] {
            let headers: Vec<(&str, &str)> = range.map(|r| ("Range", r)).into_iter().collect();
            let r = conn.get("/small.bin", &[]);
            assert_eq!((r.status, r.body.len() as u64), (200, SMALL));
            let r = conn.get("/big.bin", &headers);
            assert_eq!(r.body.len() as u64, if range.is_some() { len } else { BIG });
            assert!(
                r.body == pattern_range(start, r.body.len()),
                "{versions:?} {range:?}"
            );
        }
        let r = conn.get("/big.bin", &[("Range", "bytes=0-9,100-199,16380-16390")]);
        assert_eq!(r.status, 206);
        assert!(r
            .header("content-type")
            .unwrap()
            .starts_with("multipart/byteranges"));
    }
    assert_direct_bytes_sent(admin, 0, "HTTPS downloads");
    let ok13 = admin_metric(
        admin,
        "shardline_tls_handshakes_total",
        "version=\"TLSv1.3\"",
    );
    let ok12 = admin_metric(
        admin,
        "shardline_tls_handshakes_total",
        "version=\"TLSv1.2\"",
    );
    assert!(
        ok13 >= 5 && ok12 >= 2,
        "handshakes counted by version: 1.3 {ok13}, 1.2 {ok12}"
    );
}

#[test]
fn openssl_s_client_versions_sni_alpn_and_resumption() {
    let dir = root();
    let pki = Pki::new();
    let default = pki.leaf("default", &["default.test"], Key::EcdsaP256, 30);
    let wild = pki.leaf("wild", &["*.cdn.test"], Key::EcdsaP384, 30);
    let exact = pki.leaf("exact", &["exact.cdn.test"], Key::Rsa2048, 30);
    let cfg = pki.config(&[default, wild, exact], "");
    let server = Server::start_tls(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let addr = tls_port(&server);
    let ca = pki.ca.to_str().unwrap();
    let get = b"GET /small.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let linger = Duration::from_millis(1500);

    for (sni, subject) in [
        (Some("exact.cdn.test"), "CN = exact.cdn.test"),
        (Some("other.cdn.test"), "CN = *.cdn.test"),
        (Some("nothing.test"), "CN = default.test"),
        (None, "CN = default.test"),
    ] {
        let mut args = vec!["-CAfile", ca];
        if let Some(s) = sni {
            args.extend(["-servername", s]);
        } else {
            args.push("-noservername");
        }
        let o = s_client(addr, &args, get, linger);
        assert!(
            o.contains(&format!("subject={subject}")),
            "SNI {sni:?} -> {subject}:\n{o}"
        );
        assert!(o.contains("Verify return code: 0"), "{o}");
    }
    for (flag, proto) in [("-tls1_3", "TLSv1.3"), ("-tls1_2", "TLSv1.2")] {
        let o = s_client(
            addr,
            &[
                "-CAfile",
                ca,
                "-servername",
                "default.test",
                flag,
                "-alpn",
                "http/1.1",
            ],
            get,
            linger,
        );
        assert!(o.contains(&format!("Protocol  : {proto}")), "{flag}:\n{o}");
        assert!(o.contains("ALPN protocol: http/1.1"), "{flag}:\n{o}");
        let body = o.split("\r\n\r\n").nth(1).unwrap_or("");
        assert!(
            body.as_bytes().starts_with(&pattern_range(0, 16))
                || o.contains("Content-Length: 1000"),
            "{flag}: response:\n{o}"
        );
    }
    // Older versions are refused with an alert; a client offering only h2 too.
    for old in ["-tls1_1", "-tls1"] {
        let o = s_client(addr, &[old, "-cipher", "DEFAULT:@SECLEVEL=0"], b"", linger);
        let alert = o.contains("alert protocol version") || o.contains("alert handshake failure");
        assert!(
            alert && o.contains("Cipher is (NONE)"),
            "{old}: not refused with an alert:\n{o}"
        );
    }
    let o = s_client(addr, &["-alpn", "h2"], b"", linger);
    assert!(
        o.contains("no application protocol") || o.contains("alert number 120"),
        "ALPN h2 only:\n{o}"
    );
    // Resumption: TLS 1.2 with -reconnect, TLS 1.3 with a saved session.
    let o = s_client(addr, &["-CAfile", ca, "-tls1_2", "-reconnect"], b"", linger);
    let reused = o.matches("Reused, TLSv1.2").count();
    assert!(
        reused >= 4,
        "TLS 1.2 -reconnect resumed {reused} times:\n{o}"
    );
    let sess = dir.path().join("sess.pem");
    let sess = sess.to_str().unwrap();
    let o = s_client(
        addr,
        &["-CAfile", ca, "-tls1_3", "-sess_out", sess],
        get,
        linger,
    );
    assert!(o.contains("New, TLSv1.3"), "{o}");
    let o = s_client(
        addr,
        &["-CAfile", ca, "-tls1_3", "-sess_in", sess],
        get,
        linger,
    );
    assert!(
        o.contains("Reused, TLSv1.3"),
        "TLS 1.3 ticket not accepted:\n{o}"
    );
}

#[test]
fn a_second_edge_resumes_the_tickets_the_first_issued() {
    let dir = root();
    let (pki, certs) = pki_with_localhost();
    let keys = pki.dir.path().join("ticket.key");
    let rotate = |file: &Path| {
        let o = common::run_shardline(
            &["tls", "new-ticket-key", file.to_str().unwrap()],
            Duration::from_secs(10),
        );
        assert_eq!(o.code, Some(0), "{o:?}");
    };
    rotate(&keys);
    let shared = pki.config(
        &certs,
        &format!("tls_ticket_key_file = \"{}\"", keys.display()),
    );
    let a = Server::start_tls(dir.path(), &["--config", shared.to_str().unwrap()]);
    let (b, b_admin) =
        common::start_tls_with_admin(dir.path(), &["--config", shared.to_str().unwrap()]);
    let other = Server::start_tls(
        dir.path(),
        &["--config", pki.config(&certs, "").to_str().unwrap()],
    );
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let cc = std::sync::Arc::new(pki.client_config(versions));
        let mut first = TlsConn::connect(tls_port(&a), cc.clone(), "localhost").unwrap();
        assert_eq!(first.get("/small.bin", &[]).status, 200);
        drop(first);
        let mut on_b = TlsConn::connect(tls_port(&b), cc.clone(), "localhost").unwrap();
        assert_eq!(
            on_b.conn().handshake_kind(),
            Some(rustls::HandshakeKind::Resumed),
            "{versions:?}: edge B did not resume edge A's ticket"
        );
        let r = on_b.get("/big.bin", &[("Range", "bytes=100-199")]);
        assert!(r.body == pattern_range(100, 100));
        // An edge with other keys cannot, and falls back to a full handshake.
        let on_other = TlsConn::connect(tls_port(&other), cc.clone(), "localhost").unwrap();
        assert_eq!(
            on_other.conn().handshake_kind(),
            Some(rustls::HandshakeKind::Full),
            "{versions:?}"
        );
    }
    // openssl too, TLS 1.3: a session saved from A is reused on B.
    let sess = pki.dir.path().join("sess.pem");
    let ca = pki.ca.to_str().unwrap();
    let o = s_client(
        tls_port(&a),
        &[
            "-CAfile",
            ca,
            "-tls1_3",
            "-sess_out",
            sess.to_str().unwrap(),
        ],
        b"GET /small.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        Duration::from_millis(1500),
    );
    assert!(o.contains("New, TLSv1.3"), "{o}");
    let o = s_client(
        tls_port(&b),
        &["-CAfile", ca, "-tls1_3", "-sess_in", sess.to_str().unwrap()],
        b"",
        Duration::from_millis(1000),
    );
    assert!(
        o.contains("Reused, TLSv1.3"),
        "edge B with A's session:\n{o}"
    );
    // Rotated (new current key, A's key kept as previous), B reloaded: A's old tickets still
    // resume on B.
    let cc = std::sync::Arc::new(pki.client_config(&[&rustls::version::TLS13]));
    let mut on_a = TlsConn::connect(tls_port(&a), cc.clone(), "localhost").unwrap();
    assert_eq!(on_a.get("/small.bin", &[]).status, 200);
    drop(on_a);
    rotate(&keys);
    assert_eq!(std::fs::metadata(&keys).unwrap().len(), 96);
    send_signal(&b, "HUP");
    assert!(
        wait_for_log(&b, "configuration reloaded", Duration::from_secs(10)),
        "{}",
        b.log()
    );
    common::wait_reload_applied(b_admin, 1, 1);
    let on_b = TlsConn::connect(tls_port(&b), cc, "localhost").unwrap();
    assert_eq!(
        on_b.conn().handshake_kind(),
        Some(rustls::HandshakeKind::Resumed),
        "previous key after rotation"
    );
}

#[test]
fn certificates_reload_under_load_and_a_bad_file_keeps_the_old_one() {
    let dir = root();
    let pki = Pki::new();
    let (cert, key) = pki.leaf("old", &["localhost"], Key::EcdsaP256, 30);
    let cfg = pki.config(&[(cert.clone(), key.clone())], "");
    let (server, admin) =
        common::start_tls_with_admin(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let addr = tls_port(&server);
    // No resumption: a resumed handshake sends no certificate to compare.
    let mut no_resume = pki.client_config(&[&rustls::version::TLS13, &rustls::version::TLS12]);
    no_resume.resumption = rustls::client::Resumption::disabled();
    let cc = std::sync::Arc::new(no_resume);
    let peer = |c: &TlsConn| c.conn().peer_certificates().unwrap()[0].as_ref().to_vec();
    let mut established = TlsConn::connect(addr, cc.clone(), "localhost").unwrap();
    let old_der = peer(&established);
    assert_eq!(established.get("/small.bin", &[]).status, 200);

    // Load: downloads with byte checks all through the reloads.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loaders: Vec<_> = (0..3)
        .map(|i| {
            let (stop, cc) = (stop.clone(), cc.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut c = TlsConn::connect(addr, cc.clone(), "localhost")
                        .expect("handshake under reload");
                    let start = 1_000_000 * (i + 1) + done;
                    let r = c.get(
                        "/big.bin",
                        &[("Range", &format!("bytes={start}-{}", start + 2_000_000))],
                    );
                    assert_eq!(r.status, 206);
                    assert!(
                        r.body == pattern_range(start, 2_000_001),
                        "body under reload"
                    );
                    done += 1;
                }
                done
            })
        })
        .collect();

    // Renewed in place (same file names): SIGHUP serves the new one to new handshakes.
    let (new_cert, new_key) = pki.leaf("new", &["localhost"], Key::EcdsaP384, 60);
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    send_signal(&server, "HUP");
    assert!(
        wait_for_log(&server, "configuration reloaded", Duration::from_secs(10)),
        "{}",
        server.log()
    );
    common::wait_reload_applied(admin, 1, 1);
    let fresh = TlsConn::connect(addr, cc.clone(), "localhost").unwrap();
    let new_der = peer(&fresh);
    assert_ne!(
        new_der, old_der,
        "new handshakes still get the old certificate"
    );
    assert_eq!(
        new_der,
        std::fs::read(&new_cert)
            .map(|p| rustls::pki_types::CertificateDer::from_pem_slice(&p)
                .unwrap()
                .as_ref()
                .to_vec())
            .unwrap()
    );
    // The connection made before the reload goes on.
    let r = established.get("/big.bin", &[("Range", "bytes=7-70006")]);
    assert!(
        r.status == 206 && r.body == pattern_range(7, 70_000),
        "established connection after reload"
    );

    // A broken key file: one log line names it, the running certificate stays.
    std::fs::write(
        &key,
        b"-----BEGIN PRIVATE KEY-----\nbm9wZQ==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    send_signal(&server, "HUP");
    let named = wait_for_log(
        &server,
        &format!(
            "TLS not reloaded, the running certificates and ticket keys stay: {}",
            key.display()
        ),
        Duration::from_secs(10),
    );
    assert!(named, "{}", server.log());
    std::thread::sleep(Duration::from_millis(300));
    let after_bad = TlsConn::connect(addr, cc.clone(), "localhost").unwrap();
    assert_eq!(
        peer(&after_bad),
        new_der,
        "a bad file must keep the running certificate"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for l in loaders {
        total += l.join().expect("a download failed during the reloads");
    }
    assert!(total >= 3, "the load ran ({total} downloads)");
    assert_eq!(
        admin_metric(admin, "shardline_tls_handshakes_total", "result=\"failed\""),
        0
    );
}

use rustls::pki_types::pem::PemObject;

#[test]
fn wrong_protocols_bad_records_and_slow_handshakes_are_refused() {
    let dir = root();
    let (pki, certs) = pki_with_localhost();
    let cfg = pki.config(&certs, "tls_handshake_timeout_ms = 1500");
    let (server, admin) =
        common::start_tls_with_admin(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let addr = tls_port(&server);

    // Cleartext HTTP on the TLS port: a plain 400 that says so, then a close.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /small.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(
        resp.body,
        b"The plain HTTP request was sent to HTTPS port\n"
    );
    assert!(common::expect_closed(&mut r).is_empty());

    // A ClientHello on the cleartext port: a 400 that says so, then a close.
    let hello = {
        let cc = pki.client();
        let mut c = rustls::ClientConnection::new(cc, "localhost".try_into().unwrap()).unwrap();
        let mut out = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut out).unwrap();
        }
        out
    };
    let mut s = server.connect();
    s.write_all(&hello).unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 400);
    assert!(
        String::from_utf8_lossy(&resp.body).contains("TLS handshake was sent to a plain HTTP port")
    );

    // A bad record after the handshake: an alert (bad_record_mac), then a close.
    let mut conn = TlsConn::connect(addr, pki.client(), "localhost").unwrap();
    assert_eq!(conn.get("/small.bin", &[]).status, 200);
    let sock = &mut conn.stream.get_mut().sock;
    sock.write_all(&[23, 3, 3, 0, 40]).unwrap();
    sock.write_all(&[0x5a; 40]).unwrap();
    let err = conn.read_to_close().unwrap_err();
    assert!(err.to_string().contains("BadRecordMac"), "{err}");

    // A record longer than TLS allows: refused (record_overflow).
    let mut conn = TlsConn::connect(addr, pki.client(), "localhost").unwrap();
    conn.stream
        .get_mut()
        .sock
        .write_all(&[23, 3, 3, 0x48, 0x01])
        .unwrap();
    let err = conn.read_to_close().unwrap_err();
    assert!(err.to_string().contains("RecordOverflow"), "{err}");

    // A ClientHello at a few bytes a second: closed at tls_handshake_timeout_ms.
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut closed = false;
    for b in &hello {
        if s.write_all(std::slice::from_ref(b)).is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            _ => {
                closed = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        if t0.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let took = t0.elapsed();
    assert!(
        closed && took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "slow ClientHello closed after {took:?} (closed: {closed})"
    );
    assert!(
        admin_metric(
            admin,
            "shardline_tls_handshakes_total",
            "result=\"timeout\""
        ) >= 1
    );

    // Handshake bytes past the limit (one ClientHello announcing 16 MiB): closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut big = vec![22u8, 3, 1, 0x40, 0x00, 1, 0xff, 0xff, 0xff];
    big.resize(5 + 0x4000, 0);
    let mut writes_failed = false;
    for _ in 0..4 {
        if s.write_all(&big[..5 + 0x4000]).is_err() {
            writes_failed = true;
            break;
        }
        big.truncate(5);
        big.resize(5 + 0x4000, 0);
    }
    let mut rest = Vec::new();
    let read = s.read_to_end(&mut rest);
    let reset = matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
    assert!(
        writes_failed || read.is_ok() || reset,
        "an oversized handshake was not closed: {read:?}"
    );
    let refused = admin_metric(
        admin,
        "shardline_tls_handshakes_total",
        "result=\"too_large\"",
    ) + admin_metric(admin, "shardline_tls_handshakes_total", "result=\"failed\"");
    assert!(refused >= 1, "oversized handshake not counted");

    // Garbage and truncated hellos at every length: never a panic, the server still serves.
    for cut in (0..hello.len()).step_by(37) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello[..cut]).unwrap();
        s.write_all(&[0x16, 3, 3, 0, 2, 0xff, 0xff]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut server = server;
    assert!(server.alive(), "the server died:\n{}", server.log());
    let plain = admin_metric(
        admin,
        "shardline_tls_handshakes_total",
        "result=\"plain_http\"",
    );
    assert_eq!(plain, 1);
    let mut conn = TlsConn::connect(addr, pki.client(), "localhost").unwrap_or_else(|e| {
        std::thread::sleep(Duration::from_millis(500));
        panic!("{e}\n{}", server.log())
    });
    let r = conn.get("/big.bin", &[("Range", "bytes=0-99999")]);
    assert!(r.body == pattern_range(0, 100_000));
}

#[test]
fn clean_closes_send_close_notify() {
    let dir = root();
    let (pki, certs) = pki_with_localhost();
    let cfg = pki.config(&certs, "keepalive_timeout_ms = 700");
    let log = dir.path().join("access.log");
    let server = Server::start_tls(
        dir.path(),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let addr = tls_port(&server);
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let cc = std::sync::Arc::new(pki.client_config(versions));
        // Connection: close after a big body: close_notify follows the last byte.
        let mut c = TlsConn::connect(addr, cc.clone(), "localhost").unwrap();
        let r = c
            .exchange("GET /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert!(r.body == pattern_range(0, BIG as usize));
        assert!(
            c.read_to_close().is_ok(),
            "{versions:?}: no close_notify after Connection: close"
        );
        // An idle keep-alive connection closed by its timeout says so too.
        let mut c = TlsConn::connect(addr, cc.clone(), "localhost").unwrap();
        assert_eq!(c.get("/small.bin", &[]).status, 200);
        let t0 = Instant::now();
        assert!(
            c.read_to_close().is_ok(),
            "{versions:?}: idle close without close_notify"
        );
        assert!(t0.elapsed() >= Duration::from_millis(500));
        // The client's close_notify is answered with ours.
        let mut c = TlsConn::connect(addr, cc.clone(), "localhost").unwrap();
        assert_eq!(c.get("/small.bin", &[]).status, 200);
        c.stream.get_mut().conn.send_close_notify();
        c.stream.get_mut().flush().unwrap();
        assert!(
            c.read_to_close().is_ok(),
            "{versions:?}: close_notify not answered"
        );
    }
    // An error response on a connection that is not kept alive: the response, close_notify.
    let mut c = TlsConn::connect(addr, pki.client(), "localhost").unwrap();
    let r = c.exchange("GET /nope HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(r.status, 404);
    assert!(
        c.read_to_close().is_ok(),
        "no close_notify after an error response"
    );
}

#[test]
fn a_handshake_flood_past_the_queue_is_refused_and_counted() {
    let dir = root();
    let pki = Pki::new();
    // RSA-4096 signs slowly (a few ms): handshakes queue up behind each other.
    let certs = vec![pki.leaf("slow", &["localhost"], Key::Rsa4096, 30)];
    let cfg = pki.config(&certs, "tls_max_pending_handshakes = 2");
    let (server, admin) =
        common::start_tls_with_admin(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let addr = tls_port(&server);
    let cc = std::sync::Arc::new(pki.client_config(&[&rustls::version::TLS13]));
    let hellos: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            let mut c =
                rustls::ClientConnection::new(cc.clone(), "localhost".try_into().unwrap()).unwrap();
            let mut out = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut out).unwrap();
            }
            out
        })
        .collect();
    let mut socks: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    // Every ClientHello at once.
    for (s, h) in socks.iter_mut().zip(&hellos) {
        s.write_all(h).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut full = 0;
    while Instant::now() < deadline {
        full = admin_metric(
            admin,
            "shardline_tls_handshakes_total",
            "result=\"queue_full\"",
        );
        if full > 0 && admin_metric(admin, "shardline_tls_pending_handshakes", "") == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        full > 0,
        "64 ClientHellos at once against a queue of 2: none refused"
    );
    drop(socks);
    // Admitted handshakes completed and the server serves as before.
    let mut c = TlsConn::connect(addr, pki.client(), "localhost").unwrap();
    let r = c.get("/big.bin", &[("Range", "bytes=10-1000009")]);
    assert!(r.body == pattern_range(10, 1_000_000));
    let _ = Read::bytes(&mut std::io::empty());
}

/// The first bytes of a ClientHello of `body_bytes`: a handshake record header of
/// `record_bytes`, the handshake header and the legacy version. What a client that stalls mid-hello has
/// sent is this, then part of the body.
fn hello_prefix(record_bytes: usize, body_bytes: usize) -> Vec<u8> {
    let mut v = vec![0x16, 3, 1];
    v.extend_from_slice(&(record_bytes as u16).to_be_bytes());
    v.push(1);
    v.extend_from_slice(&(body_bytes as u32).to_be_bytes()[1..]);
    // legacy_version TLS 1.2 (an older one is refused at once with protocol_version).
    v.extend_from_slice(&[3, 3]);
    v
}

#[test]
fn handshake_bytes_stay_within_the_shards_budget() {
    let dir = root();
    let (pki, certs) = pki_with_localhost();
    // The smallest budget: one largest ClientHello (72 KiB).
    let cfg = pki.config(&certs, "tls_handshake_budget_bytes = 73728");
    let (server, admin) =
        common::start_tls_with_admin(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let addr = tls_port(&server);
    // A stalls after 40 KiB of a ClientHello that announces 60 KiB (three records).
    let mut a = TcpStream::connect(addr).unwrap();
    let mut sent = hello_prefix(16384, 60 * 1024);
    sent.resize(5 + 16384, 0);
    for _ in 0..2 {
        sent.extend_from_slice(&[0x16, 3, 1, 0x40, 0x00]);
        sent.resize(sent.len() + 16384, 0);
    }
    sent.truncate(40 * 1024);
    a.write_all(&sent).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let held = loop {
        let held = admin_metric(admin, "shardline_tls_handshake_bytes", "");
        if held >= 40 * 1024 || Instant::now() > deadline {
            break held;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(held, 40 * 1024, "the stalled ClientHello is counted");
    // B sends 40 KiB more: past the budget, so B gets handshake_failure and a close, A stays.
    let mut b = TcpStream::connect(addr).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    b.write_all(&sent).unwrap();
    let mut answer = Vec::new();
    let _ = b.read_to_end(&mut answer);
    assert_eq!(
        answer,
        [0x15, 3, 3, 0, 2, 2, 40],
        "a handshake_failure alert, then a close"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let over = loop {
        let over = admin_metric(
            admin,
            "shardline_tls_handshakes_total",
            "result=\"over_budget\"",
        );
        if over > 0 || Instant::now() > deadline {
            break over;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(over, 1);
    assert_eq!(
        admin_metric(admin, "shardline_tls_handshake_bytes", ""),
        40 * 1024
    );
    // A leaves: its bytes are given back, and a real client gets through.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin_metric(admin, "shardline_tls_handshake_bytes", "") != 0 {
        assert!(
            Instant::now() < deadline,
            "a closed connection's bytes stay counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = TlsConn::connect(addr, pki.client(), "localhost").unwrap();
    let r = c.get("/big.bin", &[("Range", "bytes=0-99")]);
    assert_eq!(r.body, pattern_range(0, 100));
}
