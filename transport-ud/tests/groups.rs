//! Multicast groups over soft devices on loopback: members in three workers of one process
//! join a group, one publishes, the others get every message once and in order.
#![expect(clippy::unwrap_used, reason = "test")]

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
