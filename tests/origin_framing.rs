//! No origin reply can poison the cache (issue 45): a raw-socket origin, scripted per test,
//! replays hostile replies to the real binary. Each test asserts the client's status or bytes,
//! that nothing wrong was stored (a GET after the origin is fixed gets the right bytes), and
//! that no connection carried a request after a bad reply.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::scripted_origin::{
    object, pulling_edge, ranged, Asked, Script, ScriptedOrigin, POISON,
};
use common::{get, Server};

/// shardline (one shard, so one pool of origin connections) pulling `/pull/` from `origin`.
fn edge(origin: &ScriptedOrigin) -> (Server, SocketAddr, tempfile::TempDir) {
    pulling_edge(origin.addr, "")
}

/// Issue 45, case 1: a whole reply followed by a reply of the origin's own, in the same write
/// or later while the connection is idle, for a large object (the extra bytes behind the
/// body) and a small one (the extra bytes inside the head's read). The next object comes
/// from a new connection with its own bytes, and the poisoned connection is counted.
#[test]
fn bytes_after_a_reply_never_become_the_next_object() {
    let objects = vec![
        ("/pull/big-now.bin", object(40_000, 1)),
        ("/pull/big-late.bin", object(40_000, 2)),
        ("/pull/small-now.bin", object(3_000, 3)),
        ("/pull/small-late.bin", object(3_000, 4)),
        ("/pull/next-0.bin", object(20_000, 5)),
        ("/pull/next-1.bin", object(20_000, 6)),
        ("/pull/next-2.bin", object(20_000, 7)),
        ("/pull/next-3.bin", object(20_000, 8)),
    ];
    let origin = ScriptedOrigin::start(objects.clone());
    origin.set(Arc::new(|a: &Asked, content: &[u8]| {
        let (path, range) = (a.path.as_str(), a.range);
        let reply = ranged(content, range, "");
        if !path.contains("next") {
            if path.contains("late") {
                return (reply, false, Some(POISON.to_vec()));
            }
            let mut reply = reply;
            reply.extend_from_slice(POISON);
            return (reply, true, None);
        }
        (reply, false, None)
    }));
    let (server, admin, _dir) = edge(&origin);
    for (round, (path, content)) in objects[..4].iter().enumerate() {
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(&r.body == content, "{path}: the reply's own bytes");
        if path.contains("late") {
            // The poison arrives while the connection is idle in the pool.
            origin.send_late();
        }
        // A new object: its fetch would take the pooled connection.
        let (next_path, next_content) = &objects[4 + round];
        let next = get(&server, next_path, &[("Range", "bytes=0-15")]);
        assert_eq!(next.status, 206, "after {path}");
        assert_eq!(
            next.body,
            next_content[..16],
            "after {path}: not the poison"
        );
        // Served from the cache from now on: the right bytes stay right.
        assert!(&get(&server, next_path, &[]).body == next_content);
    }
    assert!(
        common::admin_metric(admin, "shardline_origin_connections_poisoned_total", "") >= 4,
        "each poisoned connection counted"
    );
    origin.assert_no_reuse_after_bad();
    for (path, content) in &objects {
        assert!(
            &get(&server, path, &[]).body == content,
            "{path} stored right"
        );
    }
}

/// Issue 45, cases 2-5: framing that could mix two replies is refused (502), counted by
/// reason, the connection is never reused, and once the origin is fixed the object's bytes
/// are right (nothing of the bad reply was stored).
#[test]
fn ambiguous_framing_is_refused_and_nothing_of_it_is_stored() {
    let content = object(600_000, 9);
    let cases: Vec<(&'static str, &'static str, Arc<Script>)> = vec![
        (
            "/pull/te-identity.bin",
            "length_and_transfer_encoding",
            Arc::new(|a: &Asked, c: &[u8]| {
                (
                    ranged(c, a.range, "Transfer-Encoding: identity\r\n"),
                    true,
                    None,
                )
            }),
        ),
        (
            "/pull/two-te.bin",
            "length_and_transfer_encoding",
            Arc::new(|a: &Asked, c: &[u8]| {
                let (first, last) = a.range;
                // A chunked body, with a Content-Length and two Transfer-Encoding lines.
                let body = &c[first as usize..=last as usize];
                let mut reply = format!(
                    "HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\
                     Transfer-Encoding: identity\r\nContent-Length: {}\r\n\
                     Content-Range: bytes {first}-{last}/{}\r\n\r\n",
                    body.len(),
                    c.len()
                )
                .into_bytes();
                for chunk in body.chunks(1000) {
                    reply.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    reply.extend_from_slice(chunk);
                    reply.extend_from_slice(b"\r\n");
                }
                reply.extend_from_slice(b"0\r\n\r\n");
                (reply, true, None)
            }),
        ),
        (
            "/pull/two-ranges.bin",
            "bad_content_range",
            Arc::new(|a: &Asked, c: &[u8]| {
                let (first, last) = a.range;
                // Block 0's bytes, and a second Content-Range naming the next run.
                let len = last - first + 1;
                let other = format!(
                    "Content-Range: bytes {}-{}/{}\r\n",
                    first + len,
                    last + len,
                    c.len()
                );
                (ranged(c, (first, last), &other), true, None)
            }),
        ),
        (
            "/pull/plus-length.bin",
            "bad_content_length",
            Arc::new(|a: &Asked, c: &[u8]| {
                let r = a.range;
                let reply = ranged(c, r, "");
                let text = String::from_utf8_lossy(&reply[..200]).into_owned();
                let at = text.find("Content-Length: ").unwrap() + "Content-Length: ".len();
                let mut bad = reply[..at].to_vec();
                bad.push(b'+');
                bad.extend_from_slice(&reply[at..]);
                (bad, true, None)
            }),
        ),
    ];
    let objects = cases
        .iter()
        .map(|(p, _, _)| (*p, content.clone()))
        .collect();
    let origin = ScriptedOrigin::start(objects);
    let (server, admin, _dir) = edge(&origin);
    for (path, reason, script) in cases {
        origin.set(script);
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 502, "{path}");
        let label = format!("reason=\"{reason}\"");
        assert!(
            common::admin_metric(admin, "shardline_origin_replies_refused_total", &label) > 0,
            "{path}: refusal counted as {reason}"
        );
        // The origin fixed: the object's bytes are right, whole and by range.
        origin.set(Arc::new(|a: &Asked, c: &[u8]| {
            (ranged(c, a.range, ""), false, None)
        }));
        let whole = get(&server, path, &[]);
        assert_eq!(whole.status, 200, "{path} fixed");
        assert!(whole.body == content, "{path}: right bytes after the fix");
        let part = get(&server, path, &[("Range", "bytes=262144-262200")]);
        assert_eq!(part.body, content[262144..=262200], "{path}");
    }
    origin.assert_no_reuse_after_bad();
}

/// Issue 45, case 6: interim replies (100 Continue, 103 Early Hints) before the real one are
/// skipped, and the object is served right.
#[test]
fn interim_replies_are_skipped() {
    let content = object(300_000, 7);
    let origin = ScriptedOrigin::start(vec![("/pull/hints.bin", content.clone())]);
    origin.set(Arc::new(|a: &Asked, c: &[u8]| {
        let r = a.range;
        let mut reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\
                          Link: </style.css>; rel=preload\r\n\r\n"
            .to_vec();
        reply.extend_from_slice(&ranged(c, r, ""));
        (reply, false, None)
    }));
    let (server, _admin, _dir) = edge(&origin);
    let r = get(&server, "/pull/hints.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == content, "the real reply's bytes");
    let again = get(&server, "/pull/hints.bin", &[("Range", "bytes=1000-1999")]);
    assert_eq!(again.body, content[1000..2000]);
}
