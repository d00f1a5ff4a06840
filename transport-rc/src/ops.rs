//! One-sided operations of an [`Endpoint`]: RDMA WRITE, READ and atomics on a region the
//! peer registered, blocking (`read`), bounded (`read_timeout`), started and waited for
//! later ([`PendingOp`]: many in flight from one thread), and async (`PendingOp::wait_async`,
//! feature `tokio`).
//!
//! A posted operation's buffer belongs to the endpoint until the NIC is done with it: an
//! operation whose wait gives up (a timeout, a dropped `PendingOp` or future) stays posted,
//! its buffer is released when its completion (or the flush of its queue pair) arrives, and
//! its result is then dropped. The `*_timeout` calls go further: one whose operation was
//! posted and timed out fails the endpoint, which flushes its queue pair, so the operation
//! cannot happen after the caller was told it timed out (it may have happened before). A failure names the endpoint's cause once it is down (the
//! cause its events report: `PeerUnreachable` for a dead peer), else the completion's status.

use std::marker::PhantomData;
use std::time::Duration;

use rdmx_core::worker::{WorkerState, wait_until};
use rdmx_core::{Buf, DisconnectCause, Error, Result};
use rdmx_verbs::{Rkey, SharedBytes, WcStatus, WrOpcode};

use crate::endpoint::{Endpoint, RemoteRegion};
use crate::ep::{Ep, OpResult, OpSource};

/// What a one-sided operation gives when it completes.
pub trait OpOutput: Sized {
    /// The output made from the operation's buffer (READs and atomics have one).
    ///
    /// # Errors
    /// `Protocol` when a buffer that should be there is not.
    fn from_buf(buf: Option<Buf>) -> Result<Self>;
}

impl OpOutput for () {
    fn from_buf(_: Option<Buf>) -> Result<Self> {
        Ok(())
    }
}

impl OpOutput for Buf {
    fn from_buf(buf: Option<Buf>) -> Result<Self> {
        buf.ok_or_else(|| Error::Protocol("a read completed without its buffer".into()))
    }
}

impl OpOutput for u64 {
    fn from_buf(buf: Option<Buf>) -> Result<Self> {
        let b =
            buf.ok_or_else(|| Error::Protocol("an atomic completed without its buffer".into()))?;
        let w: [u8; 8] = b
            .get(..8)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| Error::Protocol("an atomic's buffer is short".into()))?;
        Ok(Self::from_ne_bytes(w))
    }
}

/// A one-sided operation under way ([`Endpoint::start_read`] and the other `start_`
/// calls): [`wait`](Self::wait), [`wait_timeout`](Self::wait_timeout),
/// [`try_wait`](Self::try_wait) or, with `tokio`, `wait_async`.
/// Dropping it before its result leaves the operation to complete on its own (its result is
/// dropped then).
#[must_use = "an operation's outcome is only known by waiting for it"]
pub struct PendingOp<'a, T: OpOutput> {
    ep: &'a Endpoint,
    seq: u32,
    done: bool,
    _out: PhantomData<fn() -> T>,
}

impl<T: OpOutput> std::fmt::Debug for PendingOp<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingOp")
            .field("endpoint", &self.ep.id())
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// The result of operation `seq` of `ep`, if it has come.
fn take_result(ep: &mut Ep, seq: u32) -> Option<Result<Option<Buf>>> {
    let i = ep.ops_done.iter().position(|r| r.seq == seq)?;
    let r = ep.ops_done.swap_remove(i);
    Some(if r.status == WcStatus::Success {
        Ok(r.buf)
    } else {
        Err(failure(ep, r.status))
    })
}

/// The error of an operation that failed with `status`: the endpoint's cause once it is
/// down (what its events say), else the status.
fn failure(ep: &Ep, status: WcStatus) -> Error {
    Error::Disconnected(ep.down_cause().unwrap_or_else(|| {
        DisconnectCause::TransportError(format!("one-sided operation failed: {status:?}"))
    }))
}

impl<T: OpOutput> PendingOp<'_, T> {
    fn look(&mut self, ws: &mut WorkerState) -> Option<Result<T>> {
        let (key, seq) = (self.ep.key, self.seq);
        let r = self.ep.rc.on(ws, |_, st, _| match st.eps.get_mut(key) {
            Some(ep) => take_result(ep, seq),
            None => Some(Err(Error::Disconnected(DisconnectCause::LocalClose))),
        })?;
        self.done = true;
        Some(r.and_then(T::from_buf))
    }

    /// Waits for the outcome.
    ///
    /// # Errors
    /// `Disconnected` with the endpoint's cause when the operation failed (the peer refused
    /// it or is unreachable: the endpoint is down then, as with verbs).
    pub fn wait(mut self) -> Result<T> {
        let ep = self.ep;
        wait_until(&ep.rc.w, ep.rc.wait_endpoint(ep.key), None, |ws| {
            self.look(ws)
        })
    }

    /// Waits at most `timeout` for the outcome. On `Timeout` the operation stays posted (its
    /// buffer is the endpoint's until it completes) and its result is dropped.
    ///
    /// # Errors
    /// As [`wait`](Self::wait), plus `Timeout`.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<T> {
        let ep = self.ep;
        wait_until(&ep.rc.w, ep.rc.wait_endpoint(ep.key), Some(timeout), |ws| {
            self.look(ws)
        })
    }

    /// The outcome if it is there (after a round of progress); `None`: not yet.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub fn try_wait(&mut self) -> Option<Result<T>> {
        let w = &self.ep.rc.w;
        let mut ws = w.lock();
        if let Some(r) = self.look(&mut ws) {
            return Some(r);
        }
        if w.progress_locked(&mut ws) > 0 {
            w.wake_all();
        }
        self.look(&mut ws)
    }

    /// Waits for the outcome without blocking the thread (feature `tokio`). A future
    /// dropped before it completes leaves the operation posted; its result is dropped.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    #[cfg(feature = "tokio")]
    pub async fn wait_async(mut self) -> Result<T> {
        let ep = self.ep;
        rdmx_core::worker::wait_async(&ep.rc.w, |ws| self.look(ws)).await
    }
}

impl<T: OpOutput> Drop for PendingOp<'_, T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (key, seq) = (self.ep.key, self.seq);
        self.ep.rc.with(|_, st, _| {
            if let Some(ep) = st.eps.get_mut(key)
                && take_result(ep, seq).is_none()
            {
                ep.ops_abandoned.push(seq);
            }
        });
    }
}

impl Endpoint {
    /// One try at posting the operation in `local` (taken when posted, left when the send
    /// queue has no room: `None` then, to wait and try again).
    fn try_post<T: OpOutput>(
        &self,
        ws: &mut WorkerState,
        op: WrOpcode,
        local: &mut Option<OpSource>,
    ) -> Option<Result<PendingOp<'_, T>>> {
        let l = local.take()?;
        match self.rc.on(ws, |sh, st, _| sh.post_op(st, self.key, op, l)) {
            Ok(Ok(seq)) => Some(Ok(PendingOp {
                ep: self,
                seq,
                done: false,
                _out: PhantomData,
            })),
            Ok(Err(back)) => {
                *local = Some(back);
                None
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// Posts a one-sided operation, waiting for room in the send queue.
    fn start_op<T: OpOutput>(&self, op: WrOpcode, local: OpSource) -> Result<PendingOp<'_, T>> {
        let mut local = Some(local);
        wait_until(&self.rc.w, self.rc.wait_endpoint(self.key), None, |ws| {
            self.try_post(ws, op, &mut local)
        })
    }

    /// Posts a one-sided operation and waits for its outcome, both within `timeout` (one
    /// wait: no clock is read here). On `Timeout` a posted operation stays posted, its result
    /// dropped (see [`PendingOp`]).
    fn run_op<T: OpOutput>(&self, op: WrOpcode, local: OpSource, timeout: Duration) -> Result<T> {
        let mut local = Some(local);
        let mut pending: Option<PendingOp<'_, T>> = None;
        let wait = self.rc.wait_endpoint(self.key);
        let r = wait_until(&self.rc.w, wait, Some(timeout), |ws| {
            if pending.is_none() {
                match self.try_post(ws, op, &mut local)? {
                    Ok(p) => pending = Some(p),
                    Err(e) => return Some(Err(e)),
                }
            }
            pending.as_mut()?.look(ws)
        });
        // (A pending operation that timed out is dropped here, outside the wait: it is
        // marked abandoned under the worker's lock.)
        let posted = pending.as_ref().is_some_and(|p| !p.done);
        drop(pending);
        if posted && matches!(r, Err(Error::Timeout(_))) {
            // A deadline that flushes: the operation must not happen after the caller was
            // told it timed out. One work request of a queue pair cannot be taken back, so
            // the endpoint fails and its queue pair is flushed; the operation's buffer is
            // released when its flush completion arrives (never before: the NIC may be
            // using it until then).
            let key = self.key;
            self.rc.with(|sh, st, cx| {
                sh.fail(
                    st,
                    cx,
                    key,
                    DisconnectCause::TransportError(
                        "a one-sided operation timed out: the endpoint's queue pair was \
                         flushed"
                            .into(),
                    ),
                );
            });
        }
        r
    }

    fn target(remote: &RemoteRegion, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= remote.len => Ok(remote.addr + offset),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit the {}-byte remote region",
                remote.len
            ))),
        }
    }

    fn aligned(remote: &RemoteRegion, offset: u64) -> Result<u64> {
        let addr = Self::target(remote, offset, 8)?;
        if addr % 8 != 0 {
            return Err(Error::InvalidArgument(format!(
                "atomic target {addr:#x} is not 8-byte aligned"
            )));
        }
        Ok(addr)
    }

    fn write_op(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: &[u8],
    ) -> Result<(WrOpcode, OpSource)> {
        let addr = Self::target(remote, offset, data.len() as u64)?;
        let mut buf = self.rc.sh.pool.try_alloc(data.len().max(1))?;
        buf.set_len(data.len())?;
        buf.copy_from_slice(data);
        Ok((
            WrOpcode::RdmaWrite {
                remote_addr: addr,
                rkey: Rkey(remote.rkey),
            },
            OpSource::Buf(buf),
        ))
    }

    fn read_op(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        len: usize,
    ) -> Result<(WrOpcode, OpSource)> {
        let addr = Self::target(remote, offset, len as u64)?;
        let mut buf = self.rc.sh.pool.try_alloc(len.max(1))?;
        buf.set_len(len)?;
        Ok((
            WrOpcode::RdmaRead {
                remote_addr: addr,
                rkey: Rkey(remote.rkey),
            },
            OpSource::Buf(buf),
        ))
    }

    fn atomic_src(&self) -> Result<OpSource> {
        let mut buf = self.rc.sh.pool.try_alloc(8)?;
        buf.fill(0);
        Ok(OpSource::Buf(buf))
    }

    fn cas_op(remote: &RemoteRegion, offset: u64, compare: u64, swap: u64) -> Result<WrOpcode> {
        Ok(WrOpcode::AtomicCmpSwap {
            remote_addr: Self::aligned(remote, offset)?,
            rkey: Rkey(remote.rkey),
            compare,
            swap,
        })
    }

    fn fadd_op(remote: &RemoteRegion, offset: u64, add: u64) -> Result<WrOpcode> {
        Ok(WrOpcode::AtomicFetchAdd {
            remote_addr: Self::aligned(remote, offset)?,
            rkey: Rkey(remote.rkey),
            add,
        })
    }

    /// Writes `data` into the peer's region at `offset` and waits until it is there.
    ///
    /// # Errors
    /// `InvalidArgument` outside the region; `Disconnected` with the endpoint's cause when
    /// the peer refused or is unreachable (the endpoint is down then, as with verbs).
    pub fn write(&self, remote: &RemoteRegion, offset: u64, data: &[u8]) -> Result<()> {
        self.start_write(remote, offset, data)?.wait()
    }

    /// [`write`](Self::write), waiting at most `timeout` (for room to post, then for the
    /// write).
    ///
    /// # Errors
    /// As `write`, plus `Timeout`; if the write was posted, the endpoint then fails and its
    /// queue pair is flushed, so it does not happen afterwards (see the module docs).
    pub fn write_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let (op, src) = self.write_op(remote, offset, data)?;
        self.run_op(op, src, timeout)
    }

    /// Starts a [`write`](Self::write) (a copy of `data`) and returns at once.
    ///
    /// # Errors
    /// As `write` (those known before it is posted).
    pub fn start_write(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: &[u8],
    ) -> Result<PendingOp<'_, ()>> {
        let (op, src) = self.write_op(remote, offset, data)?;
        self.start_op(op, src)
    }

    /// Writes application bytes into the peer's region at `offset` without copying them
    /// (an RDMA WRITE straight from the bytes, registered through the context's
    /// registration cache), and waits until they are there. For small writes a copy is
    /// cheaper: use [`write`](Self::write).
    ///
    /// # Errors
    /// As [`write`](Self::write); `Verbs` when the bytes cannot be registered.
    pub fn write_shared(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: impl Into<SharedBytes>,
    ) -> Result<()> {
        let data = data.into();
        if data.is_empty() {
            return self.write(remote, offset, &[]);
        }
        let addr = Self::target(remote, offset, data.len() as u64)?;
        let reg = self.rc.sh.regcache.register(&data)?;
        let op = WrOpcode::RdmaWrite {
            remote_addr: addr,
            rkey: Rkey(remote.rkey),
        };
        let p: PendingOp<'_, ()> = self.start_op(op, OpSource::Shared(reg))?;
        p.wait()
    }

    /// Reads `len` bytes of the peer's region at `offset`.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub fn read(&self, remote: &RemoteRegion, offset: u64, len: usize) -> Result<Buf> {
        self.start_read(remote, offset, len)?.wait()
    }

    /// [`read`](Self::read), waiting at most `timeout` (for room to post, then for the
    /// read).
    ///
    /// # Errors
    /// As `read`, plus `Timeout`; if the read was posted, the endpoint then fails and its
    /// queue pair is flushed (see the module docs).
    pub fn read_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        len: usize,
        timeout: Duration,
    ) -> Result<Buf> {
        let (op, src) = self.read_op(remote, offset, len)?;
        self.run_op(op, src, timeout)
    }

    /// Starts a [`read`](Self::read) and returns at once: several reads (of one endpoint or
    /// many) are in flight together, and each is waited for when its data is needed.
    ///
    /// # Errors
    /// As `read` (those known before it is posted).
    pub fn start_read(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        len: usize,
    ) -> Result<PendingOp<'_, Buf>> {
        let (op, src) = self.read_op(remote, offset, len)?;
        self.start_op(op, src)
    }

    /// Atomically replaces the 8-byte word at `offset` with `swap` if it equals `compare`;
    /// returns the value it had.
    ///
    /// # Errors
    /// As [`write`](Self::write); the offset must be 8-byte aligned.
    pub fn compare_swap(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        self.start_compare_swap(remote, offset, compare, swap)?
            .wait()
    }

    /// Starts a [`compare_swap`](Self::compare_swap) and returns at once.
    ///
    /// # Errors
    /// As `compare_swap` (those known before it is posted).
    pub fn start_compare_swap(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<PendingOp<'_, u64>> {
        let op = Self::cas_op(remote, offset, compare, swap)?;
        self.start_op(op, self.atomic_src()?)
    }

    /// [`compare_swap`](Self::compare_swap), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `compare_swap`, plus `Timeout`; if it was posted, the endpoint then fails and its
    /// queue pair is flushed, so the swap does not happen afterwards.
    pub fn compare_swap_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
        timeout: Duration,
    ) -> Result<u64> {
        let op = Self::cas_op(remote, offset, compare, swap)?;
        self.run_op(op, self.atomic_src()?, timeout)
    }

    /// Atomically adds `add` to the 8-byte word at `offset`; returns the value it had.
    ///
    /// # Errors
    /// As [`compare_swap`](Self::compare_swap).
    pub fn fetch_add(&self, remote: &RemoteRegion, offset: u64, add: u64) -> Result<u64> {
        self.start_fetch_add(remote, offset, add)?.wait()
    }

    /// Starts a [`fetch_add`](Self::fetch_add) and returns at once.
    ///
    /// # Errors
    /// As `fetch_add` (those known before it is posted).
    pub fn start_fetch_add(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        add: u64,
    ) -> Result<PendingOp<'_, u64>> {
        let op = Self::fadd_op(remote, offset, add)?;
        self.start_op(op, self.atomic_src()?)
    }

    /// [`fetch_add`](Self::fetch_add), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `fetch_add`, plus `Timeout`; if it was posted, the endpoint then fails and its
    /// queue pair is flushed, so the add does not happen afterwards.
    pub fn fetch_add_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        add: u64,
        timeout: Duration,
    ) -> Result<u64> {
        let op = Self::fadd_op(remote, offset, add)?;
        self.run_op(op, self.atomic_src()?, timeout)
    }
}

impl Ep {
    /// Records the result of one-sided operation `r.seq`, or drops it when nobody waits for
    /// it any more (its `PendingOp` was dropped, or its wait gave up).
    pub(crate) fn op_done(&mut self, r: OpResult) {
        if let Some(i) = self.ops_abandoned.iter().position(|&s| s == r.seq) {
            self.ops_abandoned.swap_remove(i);
            return;
        }
        self.ops_done.push(r);
    }
}
