//! Multicast groups over soft devices on loopback: members in three workers of one process
//! join a group, one publishes, the others get every message once and in order.
#![expect(clippy::unwrap_used, reason = "test")]

#[allow(dead_code, reason = "the simulations' generator is not used here")]
mod common;

use std::time::{Duration, Instant};

use rdmx_core::Config;
use rdmx_core::worker::{Worker, WorkerHandle};
use rdmx_ud::UdTransport;
use rdmx_ud::group::Group;
use rdmx_ud::mcast::{McastConfig, McastEvent};

fn member(name: &str) -> (Worker, WorkerHandle, Group) {
    let cfg = Config {
        srq_depth: 256,
        pool_max: 64 << 20,
        ..Config::default()
    };
    let w = Worker::open(&cfg, None, &[UdTransport::RECV_BUF_SIZE]).unwrap();
    let h = w.start().unwrap();
    let g = Group::join(&w, &cfg, name, McastConfig::default()).unwrap();
    (w, h, g)
}

/// Waits until `publisher` heard of `members` members.
fn formed(publisher: &Group, members: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while publisher.receivers() < members {
        assert!(
            Instant::now() < deadline,
            "the members never said they were there"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn msg(n: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len).map(|i| (i as u32 * 5 + n) as u8).collect();
    if len >= 4 {
        m[..4].copy_from_slice(&n.to_le_bytes());
    }
    m
}

#[test]
fn every_member_gets_every_message_once_and_in_order_on_loopback() {
    let name = format!("rdmx-test-{}", std::process::id());
    let (_wa, _ha, a) = member(&name);
    let (_wb, _hb, b) = member(&name);
    let (_wc, _hc, c) = member(&name);
    // The group forms: the publisher hears of both members.
    formed(&a, 2);
    let sizes = [0usize, 8, 100, 4000, 9000, 30_000];
    let n = 600u32;
    let publisher = std::thread::spawn(move || {
        for i in 0..n {
            a.publish_timeout(
                &msg(i, sizes[i as usize % sizes.len()]),
                Duration::from_secs(10),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "publish {i}: {e}: {:?} receivers {} events {:?}",
                    a.stats(),
                    a.receivers(),
                    std::iter::from_fn(|| a.poll_event()).collect::<Vec<_>>()
                )
            });
        }
        a
    });
    // Both members read as they go (the slowest member paces the publisher).
    let readers: Vec<_> = [b.clone(), c.clone()]
        .into_iter()
        .map(|g| {
            std::thread::spawn(move || {
                for i in 0..n {
                    let (_, m) = g
                        .recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|e| panic!("message {i}: {e}: {:?}", g.stats()));
                    assert_eq!(
                        &m[..],
                        &msg(i, sizes[i as usize % sizes.len()])[..],
                        "message {i}"
                    );
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let a = publisher.join().unwrap();
    let id = a.member_id();
    let joined = std::iter::from_fn(|| b.poll_event())
        .any(|e| e == McastEvent::PublisherJoined { publisher: id });
    assert!(joined);
    // Leaving is reported to the others.
    a.leave();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let gone = std::iter::from_fn(|| c.poll_event())
            .any(|e| matches!(e, McastEvent::PublisherGone { publisher, .. } if publisher == id));
        if gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nobody heard the publisher leave"
        );
        let _ = c.try_recv();
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_member_that_stops_reading_is_removed_and_the_others_go_on() {
    let name = format!("rdmx-test-slow-{}", std::process::id());
    let (_wa, _ha, a) = member(&name);
    let (_wb, _hb, b) = member(&name);
    let (_wc, _hc, c) = member(&name);
    formed(&a, 2);
    let (c_id, n) = (c.member_id(), 3000u32);
    let publisher = std::thread::spawn(move || {
        for i in 0..n {
            a.publish_timeout(&msg(i, 1000), Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("publish {i}: {e}"));
        }
        a
    });
    // b reads everything; c reads nothing.
    for i in 0..n {
        let (_, m) = b
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert_eq!(&m[..], &msg(i, 1000)[..]);
    }
    let a = publisher.join().unwrap();
    let removed = std::iter::from_fn(|| a.poll_event()).any(|e| {
        matches!(e, McastEvent::MemberRemoved { member, why: rdmx_ud::mcast::RemovedWhy::TooSlow } if member == c_id)
    });
    assert!(
        removed,
        "the publisher did not remove the member that stopped reading"
    );
    let told =
        std::iter::from_fn(|| c.poll_event()).any(|e| matches!(e, McastEvent::RemovedBy { .. }));
    assert!(told, "the removed member was not told");
}

#[test]
fn messages_published_in_batches_arrive_once_and_in_order() {
    let name = format!("rdmx-test-batch-{}", std::process::id());
    let (_wa, _ha, a) = member(&name);
    let (_wb, _hb, b) = member(&name);
    formed(&a, 1);
    let n = 20_000u32;
    let publisher = std::thread::spawn(move || {
        // Batches of 100, some filling the queue, and sizes from 0 B to over a datagram.
        let sizes = [8usize, 0, 24, 8, 5000, 8, 100];
        for chunk in 0..n / 100 {
            let _batch = a.batch();
            for i in chunk * 100..(chunk + 1) * 100 {
                a.publish_timeout(
                    &msg(i, sizes[i as usize % sizes.len()].max(4)),
                    Duration::from_secs(10),
                )
                .unwrap_or_else(|e| panic!("publish {i}: {e}: {:?}", a.stats()));
            }
        }
        a.flush_timeout(Duration::from_secs(10)).unwrap();
        a
    });
    for i in 0..n {
        let (_, m) = b
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}: {:?}", b.stats()));
        assert_eq!(m[..4], i.to_le_bytes(), "message {i} out of order");
        assert_eq!(m, msg(i, m.len()), "message {i} damaged");
    }
    let a = publisher.join().unwrap();
    assert_eq!(b.stats().lost, 0);
    assert!(
        matches!(b.try_recv(), Err(rdmx_core::Error::WouldBlock)),
        "a message too many"
    );
    drop(a);
}

#[test]
fn a_pooled_buffer_is_published_and_goes_back_to_its_pool() {
    let name = format!("rdmx-test-buf-{}", std::process::id());
    let (wa, _ha, a) = member(&name);
    let (_wb, _hb, b) = member(&name);
    formed(&a, 1);
    let before = wa.pool().stats().in_use_bytes;
    let mut buf = wa.pool().try_alloc(3000).unwrap();
    buf.copy_from_slice(&msg(7, 3000));
    a.publish_buf_timeout(buf, Duration::from_secs(5)).unwrap();
    let mut small = wa.pool().try_alloc(40).unwrap();
    small.copy_from_slice(&msg(8, 40));
    assert!(
        a.try_publish_buf(small).unwrap().is_none(),
        "no room for 40 bytes"
    );
    let (from, m) = b.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(from, a.member_id());
    assert_eq!(m, msg(7, 3000));
    let (_, m) = b.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(m, msg(8, 40));
    // (The datagrams' own send buffers go back when their sends complete.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while wa.pool().stats().in_use_bytes > before {
        assert!(
            Instant::now() < deadline,
            "the buffers did not go back to the pool: {:?}",
            wa.pool().stats()
        );
        let _ = a.try_recv();
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn member_with_key(name: &str, key: Option<&[u8]>) -> (Worker, WorkerHandle, Group) {
    let cfg = Config {
        srq_depth: 256,
        pool_max: 64 << 20,
        auth_key: key.map(|k| rdmx_core::bootstrap::AuthKey::new(k).unwrap()),
        ..Config::default()
    };
    let w = Worker::open(&cfg, None, &[UdTransport::RECV_BUF_SIZE]).unwrap();
    let h = w.start().unwrap();
    let g = Group::join(&w, &cfg, name, McastConfig::default()).unwrap();
    (w, h, g)
}

/// With a key, every datagram carries the group's tag: members with the key form the group
/// and get every message; a member without the key, or with another one, is not heard at
/// all (its datagrams are dropped as unauthenticated before anything looks at them, so it
/// cannot even take a member id).
#[test]
fn with_a_key_only_members_holding_it_are_heard() {
    const KEY: &[u8] = b"a group key of enough bytes";
    let name = format!("rdmx-test-auth-{}", std::process::id());
    let (_wa, _ha, a) = member_with_key(&name, Some(KEY));
    let (_wb, _hb, b) = member_with_key(&name, Some(KEY));
    let (_wn, _hn, none) = member_with_key(&name, None);
    let (_ww, _hw, wrong) = member_with_key(&name, Some(b"another key of enough bytes"));
    // The strangers publish too (their heartbeats and data reach everybody).
    for i in 0..20u32 {
        none.publish_timeout(&msg(i, 64), Duration::from_secs(5))
            .unwrap();
        wrong
            .publish_timeout(&msg(i, 64), Duration::from_secs(5))
            .unwrap();
    }
    formed(&a, 1);
    let n = 200u32;
    for i in 0..n {
        a.publish_timeout(&msg(i, 100 + i as usize), Duration::from_secs(10))
            .unwrap();
    }
    for i in 0..n {
        let (_, m) = b.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&m[..], &msg(i, 100 + i as usize)[..], "message {i}");
    }
    // Nothing from the strangers, then or later; they were heard of by nobody.
    std::thread::sleep(Duration::from_millis(200));
    assert!(b.recv_timeout(Duration::from_millis(50)).is_err());
    assert_eq!(
        a.receivers(),
        1,
        "only the member with the key paces the publisher"
    );
    for g in [&a, &b] {
        let s = g.stats();
        assert!(s.unauthenticated > 0, "{s:?}");
        assert_eq!(s.forged, 0, "{s:?}");
    }
    // A member with another key takes nothing of the group's. (One without a key may read
    // what it overhears: the tag authenticates, it does not hide.)
    assert!(wrong.recv_timeout(Duration::from_millis(50)).is_err());
    assert!(wrong.stats().unauthenticated > 0);
    drop(none);
}

/// A stranger on the network, with a raw UD queue pair attached to the group: it captures a
/// keyed member's datagram and sends it again, as it is and altered. Neither passes (the tag
/// covers the sender's queue pair and every byte); the member that gets them counts them
/// and takes nothing from them.
#[test]
fn with_a_key_replayed_and_altered_datagrams_are_dropped() {
    use rdmx_verbs::{AccessFlags, AhAttr, Device, Gid, Qpn, RecvWr, SendWr, WorkCompletion};
    const KEY: &[u8] = b"a group key of enough bytes";
    let name = format!("rdmx-test-replay-{}", std::process::id());
    let (_wa, _ha, a) = member_with_key(&name, Some(KEY));
    let (_wb, _hb, b) = member_with_key(&name, Some(KEY));
    formed(&a, 1);
    // The stranger.
    let ctx = Device::open("soft:127.0.0.1").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = common::raw_ud_qp(&pd, &cq, 8, 32);
    let id = rdmx_ud::mcast::wire::group_id(&name);
    let mgid = Gid::from_ip(std::net::IpAddr::V4(rdmx_ud::group::group_addr(id)));
    qp.attach_mcast(mgid, 0).unwrap();
    let mr = pd.reg_mr(32 * 8192, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..32u64 {
        let sge = [mr.sge(i as usize * 8192, 8192)];
        qp.post_recv(&RecvWr::new(i, &sge)).unwrap();
    }
    // A data datagram of A's, captured (after the 40-byte GRH).
    a.publish_timeout(b"captured", Duration::from_secs(5))
        .unwrap();
    let (_, m) = b.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(&m[..], b"captured");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut wc = [WorkCompletion::EMPTY; 32];
    let captured = 'found: loop {
        let n = cq.poll(&mut wc);
        for c in &wc[..n] {
            let d = mr
                .to_vec(c.wr_id as usize * 8192, c.byte_len as usize)
                .unwrap();
            if d.len() > 40 && d[40..].windows(8).any(|w| w == b"captured") {
                break 'found d[40..].to_vec();
            }
        }
        assert!(Instant::now() < deadline, "the stranger captured nothing");
        std::thread::sleep(Duration::from_millis(1));
    };
    let to_group = pd.create_ah(&AhAttr::new(mgid)).unwrap();
    let before = b.stats().unauthenticated;
    let send = |bytes: &[u8], id: u64| {
        let smr = pd.reg_mr(bytes.len(), AccessFlags::LOCAL_WRITE).unwrap();
        smr.write(0, bytes).unwrap();
        let sge = [smr.sge(0, bytes.len())];
        qp.post_send(&SendWr::send(id, &sge).signaled().to(
            &to_group,
            Qpn::MULTICAST,
            rdmx_ud::QKEY,
        ))
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(smr);
    };
    // As it is (a replay from another queue pair), and with its last payload byte changed
    // (and the tag left as it was).
    send(&captured, 100);
    let mut altered = captured.clone();
    let at = altered.len() - 17;
    altered[at] ^= 0xff;
    send(&altered, 101);
    let deadline = Instant::now() + Duration::from_secs(2);
    while b.stats().unauthenticated < before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.stats().unauthenticated >= before + 2, "{:?}", b.stats());
    assert_eq!(b.stats().forged, 0);
    assert!(
        b.recv_timeout(Duration::from_millis(100)).is_err(),
        "a replay was taken"
    );
    // The group goes on.
    a.publish_timeout(b"after", Duration::from_secs(5)).unwrap();
    assert_eq!(
        &b.recv_timeout(Duration::from_secs(5)).unwrap().1[..],
        b"after"
    );
}
