//! Restart handover: which other processes listen in our SO_REUSEPORT group, read from
//! `/proc/net/tcp{,6}` (listening sockets of this network namespace with their inodes).
//!
//! A new process binds the same address while the old one still serves (both sockets join one
//! reuseport group). The new one must not attach its steering table over the old one's, and
//! the old one, at SIGTERM, hands new connections to the new one before it closes its
//! listeners (see `steering`). Both need to know whether the other is there.

use std::net::SocketAddr;
use std::path::Path;

/// TCP state code of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN_STATE: &str = "0A";

/// The address as `/proc/net/tcp{,6}` prints it: the in-memory words of the address in hex
/// (host byte order), a colon, the port in hex.
fn proc_net_address(addr: &SocketAddr) -> String {
    let host = match addr {
        SocketAddr::V4(a) => format!("{:08X}", u32::from_ne_bytes(a.ip().octets())),
        SocketAddr::V6(a) => a
            .ip()
            .octets()
            .chunks_exact(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect(),
    };
    format!("{host}:{:04X}", addr.port())
}

/// Inodes of the listening sockets bound exactly to `addr`, from the text of a
/// `/proc/net/tcp` table.
fn listening_inodes_in(table: &str, addr: &SocketAddr) -> Vec<u64> {
    let want = proc_net_address(addr);
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            (*local == want && *state == TCP_LISTEN_STATE)
                .then(|| inode.parse().ok())
                .flatten()
        })
        .collect()
}

/// Listening sockets on `addr` in this network namespace that are not ours (`own` are the
/// inodes of our listeners): another process in our reuseport group. An unreadable table
/// counts as none (then no handover steering happens; the drain still works).
pub fn foreign_listeners(proc_net: &Path, addr: &SocketAddr, own: &[u64]) -> usize {
    let table = if addr.is_ipv4() { "tcp" } else { "tcp6" };
    let text = std::fs::read_to_string(proc_net.join(table)).unwrap_or_default();
    listening_inodes_in(&text, addr)
        .into_iter()
        .filter(|ino| !own.contains(ino))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 100 0 0 10 0
   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
   4: 0A00000A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn address_is_printed_as_the_kernel_does() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_net_address(&a), "0100007F:1F90");
        let a: SocketAddr = "[::1]:443".parse().unwrap();
        assert_eq!(
            proc_net_address(&a),
            "00000000000000000000000001000000:01BB"
        );
    }

    #[test]
    fn only_listeners_on_the_same_address_count() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(listening_inodes_in(TABLE, &a), vec![1111, 2222]);
        let b: SocketAddr = "10.0.0.10:8080".parse().unwrap();
        assert_eq!(listening_inodes_in(TABLE, &b), vec![5555]);
    }

    #[test]
    fn our_own_sockets_are_not_foreign() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tcp"), TABLE).unwrap();
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(foreign_listeners(dir.path(), &a, &[1111]), 1);
        assert_eq!(foreign_listeners(dir.path(), &a, &[1111, 2222]), 0);
        assert_eq!(
            foreign_listeners(dir.path(), &"[::1]:1".parse().unwrap(), &[]),
            0
        );
    }

    #[test]
    fn a_real_listener_is_found_by_its_inode() {
        use std::os::unix::fs::MetadataExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let ino = std::fs::metadata(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&l)
        ))
        .unwrap()
        .ino();
        let proc_net = Path::new("/proc/net");
        assert_eq!(foreign_listeners(proc_net, &addr, &[]), 1);
        assert_eq!(foreign_listeners(proc_net, &addr, &[ino]), 0);
    }
}
