//! Post batches (`Context::batch_posts`): sends posted inside a batch may leave together,
//! with the completions, order and contents of the same posts made one by one. On the soft
//! provider the holding itself is checked through the NIC's transmit counter.
#![expect(
    clippy::disallowed_methods,
    reason = "holding is checked only while the posts are younger than the hold limit"
)]

use std::time::{Duration, Instant};

use rdmx_verbs::{RecvWr, SendWr, WcStatus};

use crate::common::{Side, on_soft};

fn pair() -> (Side, Side) {
    let a = Side::new(1 << 16, 100);
    let b = Side::new(1 << 16, 200);
    a.connect(&b.info());
    b.connect(&a.info());
    for i in 0..256u64 {
        let r = [b.mr.sge(i as usize * 64, 64)];
        b.qp.post_recv(&RecvWr::new(i, &r)).unwrap();
    }
    (a, b)
}

fn msg(i: u64) -> [u8; 12] {
    let mut m = [0u8; 12];
    m[..8].copy_from_slice(&i.to_be_bytes());
    m[8..].copy_from_slice(b"bat!");
    m
}

fn tx(s: &Side) -> u64 {
    s.ctx.counters().tx_packets
}

/// Whether holding can be checked: on the soft provider, and only while the posts are
/// younger than the device's 1 ms hold limit (after it, the engine thread sends them; a
/// loaded machine can take that long to post a few sends).
fn can_check_hold(since: Instant) -> bool {
    on_soft() && since.elapsed() < Duration::from_micros(500)
}

/// Checks that `b` received messages `0..n` in order, each in the receive posted for it.
fn check_received(b: &Side, n: u64) {
    let wcs = b.wait(n as usize);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.wr_id, i as u64, "receives complete in posting order");
        assert_eq!(wc.byte_len, 12);
        let got = b.mr.to_vec(i * 64, 12).unwrap();
        assert_eq!(got, msg(i as u64), "message {i}");
    }
}

#[test]
fn sends_in_a_batch_are_held_then_leave_in_order() {
    let (a, b) = pair();
    let before = tx(&a);
    {
        let _batch = a.ctx.batch_posts();
        let t0 = Instant::now();
        for i in 0..10 {
            let m = msg(i);
            a.qp.post_send(&SendWr::send_inline(i, &m).signaled())
                .unwrap();
        }
        if can_check_hold(t0) {
            assert_eq!(tx(&a), before, "ten posts in a batch are held");
        }
    }
    if on_soft() {
        assert_eq!(tx(&a), before + 10, "closing the batch sends them");
    }
    let wcs = a.wait(10);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    check_received(&b, 10);
}

#[test]
fn a_full_batch_flushes_and_a_poll_sends_what_is_held() {
    let (a, b) = pair();
    let before = tx(&a);
    let batch = a.ctx.batch_posts();
    let t0 = Instant::now();
    for i in 0..16 {
        let m = msg(i);
        a.qp.post_send(&SendWr::send_inline(i, &m)).unwrap();
    }
    if can_check_hold(t0) {
        assert_eq!(tx(&a), before, "16 posts are held");
    }
    let m = msg(16);
    a.qp.post_send(&SendWr::send_inline(16, &m)).unwrap();
    if on_soft() {
        assert_eq!(tx(&a), before + 17, "the 17th post sends all of them");
    }
    for i in 17..20 {
        let m = msg(i);
        a.qp.post_send(&SendWr::send_inline(i, &m)).unwrap();
    }
    let mut wc = [rdmx_verbs::WorkCompletion::EMPTY; 4];
    let _ = a.cq.poll(&mut wc);
    if on_soft() {
        assert_eq!(
            tx(&a),
            before + 20,
            "a poll inside the batch sends what it held"
        );
    }
    drop(batch);
    check_received(&b, 20);
}

#[test]
fn a_leaked_batch_still_sends_within_its_deadline() {
    let (a, b) = pair();
    // The batch guard belongs to this thread: run it on one that ends.
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let batch = a.ctx.batch_posts();
            for i in 0..3 {
                let m = msg(i);
                a.qp.post_send(&SendWr::send_inline(i, &m)).unwrap();
            }
            std::mem::forget(batch);
        });
    });
    check_received(&b, 3);
    // The soft device sends held posts 1 ms after the first; allow for a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn only_the_thread_with_the_batch_is_held() {
    let (a, b) = pair();
    let _batch = a.ctx.batch_posts();
    let before = tx(&a);
    std::thread::scope(|s| {
        s.spawn(|| {
            let m = msg(0);
            a.qp.post_send(&SendWr::send_inline(0, &m)).unwrap();
        });
    });
    if on_soft() {
        assert_eq!(tx(&a), before + 1, "another thread's post leaves at once");
    }
    check_received(&b, 1);
}
