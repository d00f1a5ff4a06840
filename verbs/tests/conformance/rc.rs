//! RC over the soft provider on loopback, through the public API: one process with two
//! devices, and two processes (the test binary re-runs itself as the peer).

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{PeerInfo, Side};
use rdmx_verbs::{RecvWr, SendWr, WcOpcode, WcStatus, WrOpcode};

#[test]
fn one_process_two_devices_all_operations() {
    let a = Side::new(1 << 20, 1000);
    let b = Side::new(1 << 20, 0x00FF_FFFE); // PSN wrap right away
    a.connect(&b.info());
    b.connect(&a.info());
    exercise(&a, &b.info(), |n| b.wait(n), &b);
}

/// Sends, writes, reads and atomics from `a` to the peer described by `peer`. `remote`
/// gives access to the peer's memory for checking.
fn exercise(
    a: &Side,
    peer: &PeerInfo,
    wait_peer: impl Fn(usize) -> Vec<rdmx_verbs::WorkCompletion>,
    b: &Side,
) {
    // SEND of 100 KiB into a posted receive (multi-packet at MTU 1024).
    let len = 100 * 1024;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    a.mr.write(0, &data).unwrap();
    let r = [b.mr.sge(0, 200 * 1024)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let s = [a.mr.sge(0, len)];
    a.qp.post_send(&SendWr::send(10, &s).signaled()).unwrap();
    let wc = a.wait(1);
    assert_eq!(wc[0].status, WcStatus::Success);
    let rc = wait_peer(1);
    assert_eq!(rc[0].byte_len as usize, len);
    assert_eq!(b.mr.to_vec(0, len).unwrap(), data);
    // RDMA WRITE then READ back.
    a.mr.write(300_000, b"written by RDMA").unwrap();
    let s = [a.mr.sge(300_000, 15)];
    let w = WrOpcode::RdmaWrite {
        remote_addr: peer.addr + 500_000,
        rkey: rdmx_verbs::Rkey(peer.rkey),
    };
    a.qp.post_send(&SendWr::new(11, w, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let d = [a.mr.sge(400_000, 15)];
    let rd = WrOpcode::RdmaRead {
        remote_addr: peer.addr + 500_000,
        rkey: rdmx_verbs::Rkey(peer.rkey),
    };
    a.qp.post_send(&SendWr::new(12, rd, &d).signaled()).unwrap();
    let wc = a.wait(1);
    assert_eq!(
        (wc[0].status, wc[0].opcode, wc[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 15)
    );
    assert_eq!(a.mr.to_vec(400_000, 15).unwrap(), b"written by RDMA");
    // Atomics on an 8-byte aligned word.
    let d = [a.mr.sge(600_000, 8)];
    for i in 0..10u64 {
        let fa = WrOpcode::AtomicFetchAdd {
            remote_addr: peer.addr + 700_000,
            rkey: rdmx_verbs::Rkey(peer.rkey),
            add: 3,
        };
        a.qp.post_send(&SendWr::new(100 + i, fa, &d).signaled())
            .unwrap();
        assert_eq!(a.wait(1)[0].status, WcStatus::Success);
        assert_eq!(a.mr.read_u64(600_000).unwrap(), 3 * i);
    }
    let cs = WrOpcode::AtomicCmpSwap {
        remote_addr: peer.addr + 700_000,
        rkey: rdmx_verbs::Rkey(peer.rkey),
        compare: 30,
        swap: 7,
    };
    a.qp.post_send(&SendWr::new(200, cs, &d).signaled())
        .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(a.mr.read_u64(600_000).unwrap(), 30);
    // Inline send with immediate.
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&RecvWr::new(2, &r)).unwrap();
    let mut wr = SendWr::send_inline(13, b"inline!").signaled();
    wr.opcode = WrOpcode::SendWithImm { imm: 0x0102_0304 };
    a.qp.post_send(&wr).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let rc = wait_peer(1);
    assert_eq!(rc[0].imm(), Some(0x0102_0304));
    assert_eq!(b.mr.to_vec(0, 7).unwrap(), b"inline!");
    assert_eq!(b.ctx.counters().rx_bad_icrc, 0);
}

const CHILD_ENV: &str = "RDMX_TEST_CHILD_ADDR";

/// The peer process: connects back to the parent over TCP, exchanges QP info, serves.
#[test]
#[ignore = "run by two_processes_exchange_sends_writes_reads_and_atomics as a child"]
fn child_peer() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let b = Side::new(1 << 20, 0x1234);
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.write_all(&b.info().to_bytes()).unwrap();
    let mut buf = [0u8; PeerInfo::LEN];
    tcp.read_exact(&mut buf).unwrap();
    let a = PeerInfo::from_bytes(&buf);
    b.connect(&a);
    // Receive 1000 messages and echo each back; then wait for the parent to say done.
    for i in 0..1000u64 {
        let r = [b.mr.sge(0, 4096)];
        b.qp.post_recv(&RecvWr::new(i, &r)).unwrap();
        let wc = b.wait(1);
        assert_eq!(wc[0].status, WcStatus::Success);
        let n = wc[0].byte_len as usize;
        let s = [b.mr.sge(0, n)];
        b.qp.post_send(&SendWr::send(i, &s).signaled()).unwrap();
        assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    }
    let mut done = [0u8; 1];
    tcp.read_exact(&mut done).unwrap();
    // The parent wrote into our memory and did atomics on it.
    assert_eq!(b.mr.to_vec(500_000, 5).unwrap(), b"hello");
    assert_eq!(b.mr.read_u64(700_000).unwrap(), 5000);
    tcp.write_all(b"k").unwrap();
}

#[test]
fn two_processes_exchange_sends_writes_reads_and_atomics() {
    common::with_peer_process("rc::child_peer", CHILD_ENV, |mut tcp| {
        let a = Side::new(1 << 20, 0x00FF_FF00);
        let mut buf = [0u8; PeerInfo::LEN];
        tcp.read_exact(&mut buf).unwrap();
        let b = PeerInfo::from_bytes(&buf);
        tcp.write_all(&a.info().to_bytes()).unwrap();
        a.connect(&b);
        for i in 0..1000u64 {
            let len = 1 + (i as usize * 37) % 4000;
            let msg: Vec<u8> = (0..len).map(|k| (k as u64 ^ i) as u8).collect();
            a.mr.write(8192, &msg).unwrap();
            let r = [a.mr.sge(16384, 4096)];
            a.qp.post_recv(&RecvWr::new(i, &r)).unwrap();
            let s = [a.mr.sge(8192, len)];
            a.qp.post_send(&SendWr::send(i, &s).signaled()).unwrap();
            let wcs = a.wait(2);
            assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
            assert_eq!(a.mr.to_vec(16384, len).unwrap(), msg, "echo {i}");
        }
        a.mr.write(0, b"hello").unwrap();
        let s = [a.mr.sge(0, 5)];
        let rk = rdmx_verbs::Rkey(b.rkey);
        a.qp.post_send(
            &SendWr::new(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: b.addr + 500_000,
                    rkey: rk,
                },
                &s,
            )
            .signaled(),
        )
        .unwrap();
        let d = [a.mr.sge(64, 5)];
        a.qp.post_send(
            &SendWr::new(
                2,
                WrOpcode::RdmaRead {
                    remote_addr: b.addr + 500_000,
                    rkey: rk,
                },
                &d,
            )
            .signaled(),
        )
        .unwrap();
        let d8 = [a.mr.sge(128, 8)];
        for i in 0..5u64 {
            a.qp.post_send(
                &SendWr::new(
                    3 + i,
                    WrOpcode::AtomicFetchAdd {
                        remote_addr: b.addr + 700_000,
                        rkey: rk,
                        add: 1000,
                    },
                    &d8,
                )
                .signaled(),
            )
            .unwrap();
        }
        let wcs = a.wait(7);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        assert_eq!(a.mr.to_vec(64, 5).unwrap(), b"hello");
        assert_eq!(a.mr.read_u64(128).unwrap(), 4000);
        tcp.write_all(b"d").unwrap();
        let mut ok = [0u8; 1];
        tcp.read_exact(&mut ok).unwrap();
    });
}

#[test]
fn dead_peer_gives_retry_exceeded_in_bounded_time() {
    let a = Side::new(4096, 5);
    let b = Side::new(4096, 6);
    let binfo = b.info();
    common::connect_qp_with(&a.qp, a.psn, &binfo, 8, 3);
    // The peer goes away: its device closes and nothing answers on its UDP port.
    drop(b);
    #[expect(
        clippy::disallowed_methods,
        reason = "the test bounds the failure time"
    )]
    let start = std::time::Instant::now();
    let s = [a.mr.sge(0, 64)];
    a.qp.post_send(&SendWr::send(1, &s).signaled()).unwrap();
    let wc = a.wait(1);
    assert_eq!(wc[0].status, WcStatus::RetryExcErr);
    // timeout 8 is 1.05 ms; 1 + 3 tries.
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(a.qp.state(), rdmx_verbs::QpState::Err);
    // Later posts complete with a flush error.
    a.qp.post_send(&SendWr::send(2, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::WrFlushErr);
}

#[test]
fn garbage_datagrams_are_counted_and_dropped() {
    if !common::on_soft() {
        return common::skip(
            "garbage_datagrams_are_counted_and_dropped",
            "soft provider only",
        );
    }
    let a = Side::new(4096, 1);
    let b = Side::new(4096, 2);
    a.connect(&b.info());
    b.connect(&a.info());
    let target = b.ctx.port_addr(1).unwrap();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut x: u64 = 0x1234_5678;
    let mut sent = 0u64;
    for len in 0..600usize {
        let mut d = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            d.push(x as u8);
        }
        // Some with a valid-looking BTH aimed at the real QP.
        if len >= 12 && len % 3 == 0 {
            d[0] = 0x04;
            d[1] = 0;
            let q = b.qp.qp_num().0.to_be_bytes();
            d[5..8].copy_from_slice(&q[1..4]);
        }
        sock.send_to(&d, target).unwrap();
        sent += 1;
    }
    // The QP still works afterwards.
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let s = [a.mr.sge(0, 64)];
    a.qp.post_send(&SendWr::send(1, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    let c = b.ctx.counters();
    // Every garbage datagram was dropped and counted (almost all by the ICRC check).
    assert!(c.rx_packets > sent, "{c:?}");
    assert!(
        c.rx_bad_icrc + c.rx_malformed + c.rx_bad_addr + c.rx_no_qp >= sent,
        "{c:?}"
    );
    assert_eq!(b.qp.state(), rdmx_verbs::QpState::Rts);
}

/// Application bytes registered without copying (`reg_shared`): they can be sent, written
/// from and read by the peer, but nothing (local or remote) can write them, and the region
/// keeps them alive.
#[test]
fn shared_bytes_are_readable_and_never_written() {
    use rdmx_verbs::{AccessFlags, SharedBytes, VerbsError};
    let a = Side::new(1 << 20, 5000);
    let b = Side::new(1 << 20, 9000);
    a.connect(&b.info());
    b.connect(&a.info());
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
    let shared = SharedBytes::from(data.clone());
    // Only REMOTE_READ is accepted; empty bytes are refused.
    for bad in [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    ] {
        assert!(matches!(
            a.pd.reg_shared(shared.clone(), bad),
            Err(VerbsError::InvalidArgument(_))
        ));
    }
    assert!(
        a.pd.reg_shared(shared.slice(0..0).unwrap(), AccessFlags::REMOTE_READ)
            .is_err()
    );
    let mr = a.pd.reg_shared(shared, AccessFlags::REMOTE_READ).unwrap();
    drop(data);
    assert!(mr.is_read_only());
    assert!(mr.write(0, b"x").is_err());
    assert!(mr.fill(0, 1, 0).is_err());
    assert!(mr.write_u64(0, 1).is_err());
    let expect: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(mr.to_vec(100, 10).unwrap(), &expect[100..110]);

    // SEND from the shared region.
    let r = [b.mr.sge(0, 64 * 1024)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let s = [mr.sge(0, 40_000)];
    a.qp.post_send(&SendWr::send(1, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.wait(1)[0].byte_len, 40_000);
    assert_eq!(b.mr.to_vec(0, 40_000).unwrap(), expect);

    // The peer RDMA-READs it.
    let d = [b.mr.sge(100_000, 30_000)];
    let rd = WrOpcode::RdmaRead {
        remote_addr: mr.addr() + 10_000,
        rkey: mr.rkey(),
    };
    b.qp.post_send(&SendWr::new(2, rd, &d).signaled()).unwrap();
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.mr.to_vec(100_000, 30_000).unwrap(), &expect[10_000..]);

    // A local READ into it is a local protection error (no LOCAL_WRITE).
    let d = [mr.sge(0, 8)];
    let rd = WrOpcode::RdmaRead {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&SendWr::new(3, rd, &d).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::LocProtErr);
    assert_eq!(mr.to_vec(0, 8).unwrap(), &expect[..8]);
}

/// A peer's RDMA WRITE or atomic aimed at a shared (read-only) region is refused with a
/// remote access error and changes nothing.
#[test]
fn shared_bytes_refuse_remote_writes() {
    use rdmx_verbs::{AccessFlags, SharedBytes};
    let a = Side::new(1 << 16, 100);
    let b = Side::new(1 << 16, 200);
    a.connect(&b.info());
    b.connect(&a.info());
    let mr =
        a.pd.reg_shared(SharedBytes::from(vec![7u8; 4096]), AccessFlags::REMOTE_READ)
            .unwrap();
    b.mr.write(0, &[1u8; 64]).unwrap();
    let s = [b.mr.sge(0, 64)];
    let w = WrOpcode::RdmaWrite {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
    };
    b.qp.post_send(&SendWr::new(1, w, &s).signaled()).unwrap();
    assert_eq!(b.wait(1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(mr.to_vec(0, 64).unwrap(), vec![7u8; 64]);
}

/// A lost packet is retransmitted when its ACK timeout expires even if the posting thread
/// never polls afterwards: the device's engine thread, asleep without a timer when the
/// send was posted, must learn the new deadline. (It did not: the send stayed lost until
/// the application polled again, which a thread that posts and then waits elsewhere, or a
/// message layer whose own timer thread is gone, never does.)
#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "the test measures how long the retransmission took"
)]
fn a_lost_send_is_retransmitted_while_the_sender_does_not_poll() {
    if !common::on_soft() {
        return common::skip("retransmit_without_polling", "soft provider only");
    }
    let a = Side::new(1 << 16, 100);
    let b = Side::new(1 << 16, 200);
    // ACK timeout 4.096 us x 2^12 = ~17 ms, 7 retries.
    a.connect_with_timeout(&b.info(), 12);
    // B's queue pair is still in RESET: the first transmission is dropped there.
    a.mr.write(0, b"late but whole").unwrap();
    let s = [a.mr.sge(0, 14)];
    a.qp.post_send(&SendWr::send(7, &s).signaled()).unwrap();
    let posted = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(30));
    // B comes up; A's thread does not poll from here on, until B has the message.
    b.connect_with_timeout(&a.info(), 12);
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let mut wc = [rdmx_verbs::WorkCompletion::EMPTY; 4];
    let mut got = 0;
    while got == 0 && posted.elapsed() < Duration::from_secs(2) {
        got = b.cq.poll(&mut wc);
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = posted.elapsed();
    assert_eq!(
        got, 1,
        "B got nothing in {took:?}: the send was never retransmitted"
    );
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(b.mr.to_vec(0, 14).unwrap(), b"late but whole");
    // Retransmitted at an ACK timeout (17 ms apart) once B was up at 30 ms.
    assert!(took < Duration::from_millis(500), "took {took:?}");
    let done = a.wait(1);
    assert_eq!(done[0].status, WcStatus::Success);
}

/// Memory the caller owns, registered without a copy (`reg_mr_owned`), written locally, by
/// a peer's RDMA WRITE and by its atomic, then given back with what was written.
#[test]
fn the_callers_own_memory_is_registered_and_given_back() {
    use rdmx_verbs::{AccessFlags, VerbsError};
    let a = Side::new(1 << 20, 5100);
    let b = Side::new(1 << 20, 9100);
    a.connect(&b.info());
    b.connect(&a.info());
    // (A Vec's buffer need not be page aligned as a region's own is: word accesses go by
    // the address, not by the offset.)
    let boxed: Box<[u8]> = vec![0u8; 4096].into_boxed_slice();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    assert!(matches!(
        a.pd.reg_mr_owned(Vec::new(), access),
        Err(VerbsError::InvalidArgument(_))
    ));
    let mr = a.pd.reg_mr_owned(boxed, access).unwrap();
    mr.write(0, b"local bytes").unwrap();
    // The peer writes 3000 bytes at offset 100 and adds 5 to an aligned word.
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 241) as u8).collect();
    b.mr.write(0, &data).unwrap();
    let s = [b.mr.sge(0, 3000)];
    let wr = WrOpcode::RdmaWrite {
        remote_addr: mr.addr() + 100,
        rkey: mr.rkey(),
    };
    b.qp.post_send(&SendWr::new(1, wr, &s).signaled()).unwrap();
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    let word = (mr.addr() + 3200).next_multiple_of(8);
    let off = (word - mr.addr()) as usize;
    mr.write_u64(off, 37).unwrap();
    let d = [b.mr.sge(8192, 8)];
    let fa = WrOpcode::AtomicFetchAdd {
        remote_addr: word,
        rkey: mr.rkey(),
        add: 5,
    };
    b.qp.post_send(&SendWr::new(2, fa, &d).signaled()).unwrap();
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.mr.read_u64(8192).unwrap(), 37);
    let back = mr.into_bytes().expect("the memory back");
    assert_eq!(back.len(), 4096);
    assert_eq!(&back[..11], b"local bytes");
    assert_eq!(&back[100..3100], &data[..]);
    assert_eq!(
        u64::from_ne_bytes(back[off..off + 8].try_into().unwrap()),
        42
    );
    // A region of the pool's own memory is not given back (and stays registered).
    let own = a.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let own = own.into_bytes().unwrap_err().expect("the region back");
    own.write(0, b"still there").unwrap();
}

/// The GID rdmx picks by default is a RoCE v2 entry (IPv4-mapped where the port has one).
#[test]
fn the_default_gid_is_roce_v2() {
    let ctx = common::open_test_device();
    let i = ctx.roce_v2_gid_index(1).unwrap();
    match ctx.query_gid_type(1, i) {
        Ok(t) => assert_eq!(t, rdmx_verbs::GidType::RoceV2, "GID[{i}]"),
        Err(e) => common::skip("the_default_gid_is_roce_v2", &e.to_string()),
    }
    if common::on_soft() {
        assert_eq!(i, 0, "a soft port has one entry");
    }
}
