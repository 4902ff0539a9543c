//! SO_REUSEPORT CPU steering on loopback: a client pinned to CPU k is accepted by the listener
//! of the shard on CPU k.
//!
//! What is deterministic over loopback, and why: `connect()` on a thread pinned to CPU k
//! transmits the SYN through `loopback_xmit`, which queues it on CPU k's own backlog (no RSS,
//! and RPS is off on `lo` by default); the softirq that processes it, and so runs the reuseport
//! program, runs on CPU k. The SYN-ACK and the final ACK are likewise handled on CPU k. Hence:
//! (a) the listener the program picks is the one for CPU k, (b) the accepted socket's
//! `SO_INCOMING_CPU` (set from the CPU that created it while processing the ACK) is k, and
//! (c) the client socket's `SO_INCOMING_CPU` (set when the SYN-ACK arrived) is k. On a real NIC
//! the receiving CPU is where the queue's IRQ fires instead, which is what the IRQ script sets.
//!
//! A second test installs a deliberately rotated mapping, so a pass cannot be the kernel's
//! default hash agreeing with us by luck.

mod common;
use common::two_or_more_cpus;
use shardline::shard::ring_sys::{attach_reuseport_cbpf, incoming_cpu};
use shardline::steering::reuseport_cbpf_program;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Connections opened from each CPU; several, so a lucky hash cannot pass the test.
const CONNECTIONS_PER_CPU: usize = 8;
/// How long to wait for the accepted connection to show up in some listener's queue.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `count` SO_REUSEPORT listeners on one ephemeral 127.0.0.1 port, in order (the order
/// of `listen()` is the socket index the BPF program returns).
fn reuseport_group(count: usize) -> Vec<TcpListener> {
    let mut listeners = Vec::with_capacity(count);
    let mut addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
    for _ in 0..count {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.set_reuse_port(true).unwrap();
        socket.bind(&SockAddr::from(addr)).unwrap();
        socket.listen(128).unwrap();
        // Every later socket binds the port the kernel chose for the first.
        addr = socket.local_addr().unwrap().as_socket().unwrap();
        socket.set_nonblocking(true).unwrap();
        listeners.push(TcpListener::from(socket));
    }
    listeners
}

/// Connects from a thread pinned to `cpu`; returns the client's local address and its
/// `SO_INCOMING_CPU`, keeping the stream open until the caller has accepted it.
fn connect_from(cpu: usize, addr: SocketAddr) -> (TcpStream, SocketAddr, i32) {
    std::thread::spawn(move || {
        assert!(
            core_affinity::set_for_current(core_affinity::CoreId { id: cpu }),
            "pinning to CPU {cpu} failed"
        );
        let stream = TcpStream::connect(addr).unwrap();
        let local = stream.local_addr().unwrap();
        let cpu_seen = incoming_cpu(stream.as_fd()).unwrap();
        (stream, local, cpu_seen)
    })
    .join()
    .unwrap()
}

/// Finds the listener that accepted the connection from `client`; returns its index and the
/// accepted socket's `SO_INCOMING_CPU`.
fn accept_from(listeners: &[TcpListener], client: SocketAddr) -> (usize, i32) {
    let deadline = Instant::now() + ACCEPT_TIMEOUT;
    loop {
        for (index, listener) in listeners.iter().enumerate() {
            match listener.accept() {
                Ok((stream, peer)) => {
                    assert_eq!(peer, client, "connections are opened one at a time");
                    return (index, incoming_cpu(stream.as_fd()).unwrap());
                }
                Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                Err(err) => panic!("accept on listener {index}: {err}"),
            }
        }
        assert!(Instant::now() < deadline, "no listener accepted {client}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Steers with `shard_cpus` and checks every connection from a CPU in it lands on its shard.
fn check_steering(cpus: &[usize], shard_cpus: &[usize]) {
    let listeners = reuseport_group(shard_cpus.len());
    let program = reuseport_cbpf_program(shard_cpus);
    // One attach serves the whole group.
    attach_reuseport_cbpf(listeners[0].as_fd(), &program).unwrap();
    let addr = listeners[0].local_addr().unwrap();
    for &cpu in cpus {
        let shard = shard_cpus.iter().position(|&c| c == cpu).unwrap();
        for _ in 0..CONNECTIONS_PER_CPU {
            let (_client, local, client_cpu) = connect_from(cpu, addr);
            let (accepted_by, accepted_cpu) = accept_from(&listeners, local);
            assert_eq!(
                accepted_by, shard,
                "client on CPU {cpu} (plan {shard_cpus:?}) accepted by listener {accepted_by}"
            );
            assert_eq!(
                accepted_cpu, cpu as i32,
                "accepted socket's SO_INCOMING_CPU"
            );
            assert_eq!(client_cpu, cpu as i32, "client socket's SO_INCOMING_CPU");
        }
    }
}

#[test]
fn client_on_cpu_k_is_accepted_by_listener_k() {
    let Some(cpus) = two_or_more_cpus() else {
        return;
    };
    check_steering(&cpus, &cpus);
}

#[test]
fn rotated_plan_is_obeyed() {
    let Some(cpus) = two_or_more_cpus() else {
        return;
    };
    // Shard i runs on cpus[i + 1]: a connection from cpus[0] must go to the last listener.
    let mut rotated = cpus.clone();
    rotated.rotate_left(1);
    check_steering(&cpus, &rotated);
}

#[test]
fn attach_rejects_an_empty_program() {
    let listeners = reuseport_group(1);
    let err = attach_reuseport_cbpf(listeners[0].as_fd(), &[]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
}

#[test]
fn incoming_cpu_is_unset_before_any_packet() {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    assert_eq!(incoming_cpu(socket.as_fd()).unwrap(), -1);
}
