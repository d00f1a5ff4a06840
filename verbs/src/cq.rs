//! Completion queues and completion channels.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::device::Context;
use crate::error::VerbsError;
use crate::os::{ChannelInner, clock};
use crate::types::WorkCompletion;

/// How long a blocking wait polls before it sleeps (a wake-up costs ~25-30 us here).
fn spin_time() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("RDMX_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50);
        Duration::from_micros(us)
    })
}

/// A completion channel (`struct ibv_comp_channel`): a pollable fd that becomes readable when
/// an armed CQ gets a completion.
#[derive(Debug, Clone)]
pub struct CompletionChannel {
    ctx: Context,
    pub(crate) inner: Arc<ChannelInner>,
}

impl CompletionChannel {
    pub(crate) fn new(ctx: Context) -> Result<Self, VerbsError> {
        let inner = Arc::new(ChannelInner::new().map_err(|error| VerbsError::Io {
            op: "eventfd",
            error,
        })?);
        Ok(Self { ctx, inner })
    }

    /// Waits until an armed CQ of this channel fires or `timeout` passes; consumes one event
    /// (`ibv_get_cq_event`). Returns whether an event arrived (`false`: the timeout passed,
    /// or the wait was [interrupted](Self::interrupt)). It polls for a short time
    /// (`RDMX_SPIN_US`, default 50 us) before sleeping, making progress itself meanwhile.
    ///
    /// # Errors
    /// `Io` when `poll(2)` fails.
    pub fn wait(&self, timeout: Duration) -> Result<bool, VerbsError> {
        self.wait_spin(timeout, spin_time())
    }

    /// [`wait`](Self::wait) with an explicit spin time. With `Duration::ZERO` the caller
    /// sleeps at once and is not treated as a poller (it does not hand socket reception to
    /// the engine thread early): for a background thread that must not compete with
    /// busy-polling application threads.
    ///
    /// # Errors
    /// `Io` when `poll(2)` fails.
    pub fn wait_spin(&self, timeout: Duration, spin: Duration) -> Result<bool, VerbsError> {
        let start = clock::monotonic();
        let spin = spin.min(timeout);
        let dev = self.ctx.dev();
        loop {
            if self.take() {
                return Ok(true);
            }
            if self.take_interrupt() {
                return Ok(false);
            }
            if start.elapsed() >= spin {
                break;
            }
            dev.progress();
        }
        loop {
            if self.take() {
                return Ok(true);
            }
            if self.take_interrupt() {
                return Ok(false);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Ok(false);
            }
            // (The soft provider receives packets on this thread while it sleeps, so that
            // the one that fires the channel wakes it directly.)
            dev.park(self.inner.fd.raw(), timeout - elapsed)
                .map_err(|error| VerbsError::Io { op: "poll", error })?;
        }
    }

    /// Makes the thread waiting on this channel ([`wait`](Self::wait),
    /// [`wait_spin`](Self::wait_spin)) return `false` now, or, when no thread waits, the next
    /// wait return `false` at once. For a waiter that must also wake for something other
    /// than completions, without a second file descriptor. (libibverbs has no such call: its
    /// applications poll the channel's fd together with an eventfd of their own.)
    pub fn interrupt(&self) {
        self.inner.interrupted.store(true, Ordering::Release);
        self.inner.fd.signal();
    }

    /// Consumes a pending [`interrupt`](Self::interrupt).
    fn take_interrupt(&self) -> bool {
        self.inner.interrupted.load(Ordering::Acquire)
            && self.inner.interrupted.swap(false, Ordering::AcqRel)
    }

    fn take(&self) -> bool {
        let mut q = self.inner.ready.lock();
        let got = q.pop_front().is_some();
        if q.is_empty() {
            self.inner.fd.drain();
        }
        got
    }
}

impl AsRawFd for CompletionChannel {
    /// Readable while an event is pending; valid as long as this channel lives.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.raw()
    }
}

#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) ctx: Context,
    pub(crate) id: u32,
    channel: CompletionChannel,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        self.ctx.dev().destroy_cq(self.id);
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue {
    pub(crate) fn new(
        ctx: Context,
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<Self, VerbsError> {
        if cqe == 0 || cqe > 1 << 22 {
            return Err(VerbsError::InvalidArgument(format!(
                "CQ size {cqe} must be between 1 and {}",
                1 << 22
            )));
        }
        let channel = match channel {
            Some(c) => c.clone(),
            None => CompletionChannel::new(ctx.clone())?,
        };
        let id = ctx.dev().create_cq(cqe, &channel.inner)?;
        Ok(Self {
            inner: Arc::new(CqInner { ctx, id, channel }),
        })
    }

    /// Moves up to `wc.len()` completions into `wc` and returns how many (`ibv_poll_cq`).
    /// Polling also drives the soft device: it reads the sockets on this thread, so a loop
    /// around `poll` is the busy-poll mode.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> usize {
        self.inner.ctx.dev().poll_cq(self.inner.id, wc)
    }

    /// Arms the CQ: the channel fires at the next completion (or next solicited one)
    /// (`ibv_req_notify_cq`).
    pub fn req_notify(&self, solicited_only: bool) {
        self.inner
            .ctx
            .dev()
            .req_notify_cq(self.inner.id, solicited_only);
    }

    /// The channel this CQ signals.
    pub fn channel(&self) -> &CompletionChannel {
        &self.inner.channel
    }

    /// Polls, and if nothing is there, arms the CQ and waits on its channel (spinning
    /// briefly first), up to `timeout`. Returns the number of completions (0 on timeout).
    ///
    /// # Errors
    /// `Io` when waiting fails.
    pub fn poll_blocking(
        &self,
        wc: &mut [WorkCompletion],
        timeout: Duration,
    ) -> Result<usize, VerbsError> {
        let deadline = clock::monotonic() + timeout;
        loop {
            let n = self.poll(wc);
            if n > 0 {
                return Ok(n);
            }
            self.req_notify(false);
            let n = self.poll(wc);
            if n > 0 {
                return Ok(n);
            }
            let now = clock::monotonic();
            if now >= deadline {
                return Ok(0);
            }
            self.inner.channel.wait(deadline - now)?;
        }
    }
}

impl Context {
    /// Creates a completion channel (`ibv_create_comp_channel`).
    ///
    /// # Errors
    /// `Io` when the eventfd cannot be created.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel, VerbsError> {
        CompletionChannel::new(self.clone())
    }

    /// Creates a completion queue of at least `cqe` entries (`ibv_create_cq`), signalling
    /// `channel` when armed (a private channel is used when `None`).
    ///
    /// # Errors
    /// `InvalidArgument` for a size of 0 or above the device limit.
    pub fn create_cq(
        &self,
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue, VerbsError> {
        CompletionQueue::new(self.clone(), cqe, channel)
    }
}
