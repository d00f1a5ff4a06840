//! Completion channels: `interrupt` wakes a waiter without a completion, once.
#![expect(
    clippy::disallowed_methods,
    reason = "the cases check that a wait returns early, or does not"
)]

use std::time::{Duration, Instant};

use crate::common::open_test_device;

#[test]
fn an_interrupt_ends_the_current_or_next_wait_once() {
    let ctx = open_test_device();
    let ch = ctx.create_comp_channel().expect("channel");
    let _cq = ctx.create_cq(16, Some(&ch)).expect("cq");

    // Before the wait: the next wait returns at once, without an event.
    ch.interrupt();
    let t = Instant::now();
    assert!(!ch.wait(Duration::from_secs(10)).expect("wait"));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );

    // It was consumed: the wait after it sleeps for its whole timeout.
    let t = Instant::now();
    assert!(!ch.wait(Duration::from_millis(50)).expect("wait"));
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "took {:?}",
        t.elapsed()
    );

    // During the wait, from another thread.
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            ch.interrupt();
        });
        assert!(!ch.wait(Duration::from_secs(10)).expect("wait"));
    });
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_secs(5),
        "took {took:?}"
    );
}
