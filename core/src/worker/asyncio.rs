//! The async wait of the `tokio` feature: [`wait_async`].
//!
//! A pending future registers as a sleeper: the background thread (or the leader) then
//! sleeps armed on the completion channel and, when completions arrive, runs progress and
//! wakes the futures (a `tokio::sync::Notify`). What arrives by RDMA WRITE raises no
//! completion, so a waiting future also looks again after a short, growing delay.

use std::time::Duration;

use super::{Worker, WorkerState};
use crate::Result;

/// Runs `f` under the worker's lock after progress until it gives a result, awaiting
/// completions in between. Cancellation is safe as long as `f` is: a dropped future stops
/// being counted as a sleeper.
///
/// # Errors
/// What `f` returns.
pub async fn wait_async<T>(
    w: &Worker,
    mut f: impl FnMut(&mut WorkerState) -> Option<Result<T>>,
) -> Result<T> {
    let mut delay = Duration::from_micros(100);
    loop {
        let notified = w.notify().notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        let _sleeping = {
            let mut st = w.lock();
            if w.progress_locked(&mut st) > 0 {
                w.wake_all();
            }
            if let Some(r) = f(&mut st) {
                return r;
            }
            w.arm_locked(&st);
            // Counted before the lock goes: the background thread decides under the lock
            // whether to re-arm the queues before it sleeps, and must see this future.
            w.sleeper()
        };
        w.verbs_context().yield_polling();
        // Woken by a completion (`notified`) or by the delay, whichever comes first. The
        // delay needs no runtime timer: a runtime built without `enable_time` used to make
        // this panic.
        let mut timer = super::async_timer::Delay::new(delay);
        std::future::poll_fn(|cx| {
            if notified.as_mut().poll(cx).is_ready()
                || std::pin::Pin::new(&mut timer).poll(cx).is_ready()
            {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        delay = (delay * 2).min(Duration::from_millis(5));
    }
}
