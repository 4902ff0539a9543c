//! Connection steering with the real binary: with one shard per CPU and the reuseport CBPF
//! program attached, a client on CPU k is accepted by the shard on CPU k (checked with the
//! shards' own accept counters from /metrics).

mod common;
use common::*;
use std::io::{BufReader, Read, Write};
use std::net::SocketAddr;

fn accepted_per_shard(admin: SocketAddr) -> Vec<(String, f64)> {
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    shardline::metrics::parse_exposition(body)
        .expect("metrics parse")
        .into_iter()
        .filter(|s| s.name == "shardline_connections_accepted_total")
        .filter_map(|s| {
            let shard = s
                .labels
                .iter()
                .find(|(k, _)| k == "shard")
                .map(|(_, v)| v.clone())?;
            (shard != "all").then_some((shard, s.value))
        })
        .collect()
}

fn count(v: &[(String, f64)], shard: &str) -> f64 {
    v.iter()
        .find(|(s, _)| s == shard)
        .map(|(_, n)| *n)
        .unwrap_or(0.0)
}

#[test]
fn client_on_cpu_k_is_served_by_shard_on_cpu_k() {
    let Some(cpus) = two_or_more_cpus() else {
        return;
    };
    let pair = format!("{},{}", cpus[0], cpus[1]);
    let dir = disk_tempdir();
    std::fs::write(dir.path().join("f.txt"), b"steer").unwrap();
    let (server, admin) = start_with_admin(dir.path(), &["--shards", "2", "--cpus", &pair]);
    const CONNS: usize = 20;
    for (shard, &cpu) in cpus[..2].iter().enumerate() {
        let before = accepted_per_shard(admin);
        let addr = server.addr;
        std::thread::spawn(move || {
            assert!(core_affinity::set_for_current(core_affinity::CoreId {
                id: cpu
            }));
            for _ in 0..CONNS {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /f.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let r = read_response(&mut BufReader::new(s), false).unwrap();
                assert_eq!(r.body, b"steer");
            }
        })
        .join()
        .unwrap();
        let after = accepted_per_shard(admin);
        let mine = count(&after, &shard.to_string()) - count(&before, &shard.to_string());
        let other = 1 - shard;
        let theirs = count(&after, &other.to_string()) - count(&before, &other.to_string());
        assert_eq!(
            (mine, theirs),
            (CONNS as f64, 0.0),
            "clients on CPU {cpu} must all land on shard {shard}: {before:?} -> {after:?}"
        );
    }
}
