//! Sending: the protocol chosen by size (inline, eager, rendezvous) under credit flow
//! control, one-sided operations, and posting work requests on an endpoint's queue pair.

use std::time::Duration;

use rdmx_core::header::{
    HEADER_LEN, Header, Kind, PACKED_ENTRY_LEN, PackedEntries, RTS_LEN, RtsInfo,
};
use rdmx_core::pool::PostKey;
use rdmx_core::worker::Cx;
use rdmx_core::{Buf, DisconnectCause, Error, Result, SharedBuf};
use rdmx_verbs::{AccessFlags, Clock, MwType, SendFlags, SendWr, SharedBytes, WrOpcode};

use crate::ep::{Ep, Hold, OpSource, RndvOut, RndvSrc, Status, wrid};
use crate::state::{Shared, State};
use crate::timers::Timer;

/// Inline payloads up to this size are framed in a stack buffer (larger ones, possible only
/// with a raised `RDMX_INLINE_THRESHOLD`, on the heap).
const SMALL_INLINE: usize = 240;
/// An unsignaled send is followed by a signaled one at least this often.
const SIGNAL_EVERY: u32 = 16;
/// The most payload a packed frame carries: one 4 KiB packet with its header.
const PACK_MAX: usize = 4096 - HEADER_LEN;
/// The longest a packed frame stays open: the pack flusher posts it then, if nothing else
/// did (the bound the soft device keeps for the sends a batch holds).
pub(crate) const PACK_HOLD: Duration = Duration::from_millis(1);
/// How long after its last credit went a sender that waits for one tells the peer it is
/// starving (a grant is normally back within a round trip; the flag costs two mailbox writes
/// per episode).
const STARVING_AFTER: Duration = Duration::from_millis(1);

/// How a send is carried.
#[derive(Debug)]
pub(crate) enum Payload<'a> {
    /// Bytes the caller lends for the duration of the call.
    Bytes(&'a [u8]),
    /// A pooled buffer the caller gives away (zero copy).
    Buf(Buf),
    /// Application bytes sent from where they are (zero copy through the registration
    /// cache when large).
    Shared(SharedBytes),
    /// A pooled buffer several sends share (read in place when large).
    SharedBuf(SharedBuf),
    /// Slices sent as one message, copied once into what carries it.
    Parts(&'a [&'a [u8]]),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Self::Parts(p) => p.iter().map(|s| s.len()).sum(),
            other => other.contiguous().map_or(0, <[u8]>::len),
        }
    }

    /// The bytes, when they are in one piece (all but `Parts`).
    fn contiguous(&self) -> Option<&[u8]> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Buf(b) => Some(b),
            Self::Shared(b) => Some(b),
            Self::SharedBuf(b) => Some(b),
            Self::Parts(_) => None,
        }
    }

    /// Copies the bytes into `dst` (exactly `len()` long).
    fn copy_to(&self, dst: &mut [u8]) {
        match (self, self.contiguous()) {
            (_, Some(b)) => dst.copy_from_slice(b),
            (Self::Parts(parts), None) => {
                let mut at = 0;
                for p in *parts {
                    dst[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
            }
            (_, None) => {}
        }
    }

    /// The bytes in one piece: borrowed, or for `Parts` joined (the small sends only).
    fn joined(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.contiguous() {
            Some(b) => std::borrow::Cow::Borrowed(b),
            None => {
                let mut v = vec![0; self.len()];
                self.copy_to(&mut v);
                std::borrow::Cow::Owned(v)
            }
        }
    }
}

/// Takes a credit for a message, noting when the last one goes (see `STARVING_AFTER`).
/// Takes a credit of `ep`; the clock is read only when that was the last one (a clock read
/// per message showed in the message rate).
fn spend_credit(ep: &mut Ep, clock: &Clock) {
    ep.send.take();
    if ep.send.available() == 0 {
        ep.recall.emptied_at = Some(clock.now());
    }
}

impl Shared {
    /// Sends one message on endpoint `k` if a credit and a send slot are free now.
    /// `Ok(None)` means "would block" (and gives the payload back).
    pub(crate) fn try_send<'a>(
        &self,
        st: &mut State,
        cx: &mut Cx<'_>,
        k: usize,
        payload: Payload<'a>,
    ) -> Result<Option<Payload<'a>>> {
        let len = payload.len();
        self.check_sendable(st, k, len)?;
        // Inside a send batch, small messages share packed frames.
        if len <= self.inline_max
            && cx.worker().batch_open()
            && self.pack(st, cx, k, &payload.joined())?
        {
            return Ok(None);
        }
        // Any other send goes after the endpoint's packed frame, to keep the order.
        if !self.flush_pack(st, k)? {
            return Ok(Some(payload));
        }
        if !st.eps.contains(k) {
            return Err(Error::Disconnected(DisconnectCause::LocalClose));
        }
        if !self.has_credit(st, cx, k) {
            self.out_of_credit(st, cx, k);
            return Ok(Some(payload));
        }
        Self::not_starving(st, k);
        let ep = &mut st.eps[k];
        if ep.sq_used() + 2 >= ep.sq_depth {
            return Ok(Some(payload));
        }
        let eager_limit = self.cfg.rndv_threshold.min(ep.peer_eager_limit);
        // Inline only what fits the peer's receive buffers (its eager limit may be below
        // our inline threshold).
        if len <= self.inline_max && len < eager_limit {
            self.send_inline(st, k, &payload.joined(), cx.worker().clock())?;
            Ok(None)
        } else if len < eager_limit {
            self.send_eager(st, k, payload, cx.worker().clock())
        } else {
            self.send_rndv(st, cx, k, payload)
        }
    }

    /// Whether endpoint `k` may send a `len`-byte message at all.
    fn check_sendable(&self, st: &State, k: usize, len: usize) -> Result<()> {
        let Some(ep) = st.eps.get(k) else {
            return Err(Error::Disconnected(DisconnectCause::LocalClose));
        };
        if let Some(c) = ep.down_cause() {
            return Err(Error::Disconnected(c));
        }
        if ep.status != Status::Open {
            let cause = if ep.peer_closed {
                DisconnectCause::PeerClosed
            } else {
                DisconnectCause::LocalClose
            };
            return Err(Error::Disconnected(cause));
        }
        let max = self.cfg.max_message.min(ep.peer_max_message);
        if len > max {
            return Err(Error::MessageTooLarge { len, max });
        }
        Ok(())
    }

    /// Endpoint `k` has no credit. Usually the next grant is on its way; after
    /// `STARVING_AFTER` without one, the peer is told (once) that we wait (see `recall.rs`).
    fn out_of_credit(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) {
        let Some(ep) = st.eps.get_mut(k) else { return };
        let now = cx.now();
        let waits_since = *ep.recall.starved_since.get_or_insert(now);
        // Counted from when the last credit went: an endpoint that used it long ago (a
        // server answering the next request) gets no grant unless it asks.
        let since = ep
            .recall
            .emptied_at
            .map_or(waits_since, |t| t.min(waits_since));
        if ep.recall.starving {
            return;
        }
        // A gate, looked at by the sends that find no credit: a timer that woke the
        // background thread instead (once a millisecond while a busy sender kept running
        // out of credits) cost 15 % of the 8-byte message rate on two cores.
        let _ = ep.timers.set(Timer::Starving, since + STARVING_AFTER);
        if ep.timers.is_due(Timer::Starving, now) {
            ep.recall.starving = true;
            ep.timers.clear(Timer::Starving);
            super::recall::write_recall(st, k);
            super::recall::lend_idle(self, st, cx, k);
        }
    }

    /// The header of the next message of `ep`, with the counters it piggybacks (which it
    /// then has told the peer).
    fn next_header(ep: &mut Ep, kind: Kind, len: usize) -> Header {
        let h = Header {
            kind,
            tag: ep.peer_tag,
            grant: ep.recv.advertise(),
            rndv_done: ep.rndv_in_done,
            len: len as u32,
            flags: 0,
        };
        ep.rndv_in_adv = ep.rndv_in_done;
        h
    }

    /// Sends `data` inline: copied into the work request, no buffer held.
    fn send_inline(&self, st: &mut State, k: usize, data: &[u8], clock: &Clock) -> Result<()> {
        let ep = &mut st.eps[k];
        spend_credit(ep, clock);
        Self::post_inline(ep, data)?;
        st.stats.sent_inline += 1;
        Ok(())
    }

    /// Posts `data` as one inline message on `ep` (its credit already taken).
    fn post_inline(ep: &mut Ep, data: &[u8]) -> Result<()> {
        let len = data.len();
        let hdr = Self::next_header(ep, Kind::Data, len);
        // A small frame on the stack (the default inline limit fits): clearing a 4 KiB
        // array on every send cost more than the rest of this path.
        let mut small = [0u8; HEADER_LEN + SMALL_INLINE];
        let mut large = Vec::new();
        let frame: &mut [u8] = if len <= SMALL_INLINE {
            &mut small[..HEADER_LEN + len]
        } else {
            large.resize(HEADER_LEN + len, 0);
            &mut large
        };
        hdr.write(frame);
        frame[HEADER_LEN..].copy_from_slice(data);
        post_on(
            ep,
            WrOpcode::Send,
            PostData::Inline(frame),
            Hold::None,
            false,
        )?;
        tracing::trace!(
            endpoint = ep.id,
            len,
            "send: inline (payload copied into the work request)"
        );
        Ok(())
    }

    /// Sends `payload` eagerly: copied into a pooled registered buffer, held until the send
    /// completes. Hands the payload back when the pool has no buffer now.
    fn send_eager<'a>(
        &self,
        st: &mut State,
        k: usize,
        payload: Payload<'a>,
        clock: &Clock,
    ) -> Result<Option<Payload<'a>>> {
        let len = payload.len();
        let mut b = match self.pool.try_alloc(HEADER_LEN + len) {
            Ok(b) => b,
            Err(Error::WouldBlock) => return Ok(Some(payload)),
            Err(e) => return Err(e),
        };
        let ep = &mut st.eps[k];
        let hdr = Self::next_header(ep, Kind::Data, len);
        hdr.write(&mut b);
        payload.copy_to(&mut b[HEADER_LEN..]);
        spend_credit(ep, clock);
        post_on(
            ep,
            WrOpcode::Send,
            PostData::Buf(self.post_key),
            Hold::Buf(b),
            true,
        )?;
        st.stats.sent_eager += 1;
        tracing::trace!(
            endpoint = ep.id,
            len,
            "send: eager (copied into a pooled registered buffer)"
        );
        Ok(None)
    }

    /// Sends `payload` by rendezvous: the peer reads the buffer, then reports it done. At
    /// most `rndv_window` may await their read; the one that fills the window asks the peer
    /// to signal the next read done, which wakes us if we then wait. Hands the payload back
    /// when the window is full or the pool has no buffer for a copy now.
    fn send_rndv<'a>(
        &self,
        st: &mut State,
        cx: &mut Cx<'_>,
        k: usize,
        payload: Payload<'a>,
    ) -> Result<Option<Payload<'a>>> {
        let len = payload.len();
        let window = self.cfg.rndv_window as usize;
        // The window's bind takes a send slot of its own.
        if (self.confine || self.confine_xrc) && st.eps[k].sq_used() + 3 >= st.eps[k].sq_depth {
            return Ok(Some(payload));
        }
        if st.eps[k].rndv_out.len() >= window {
            self.read_mailbox(st, cx, k);
            if st.eps[k].rndv_out.len() >= window {
                return Ok(Some(payload));
            }
        }
        let src = match payload {
            // Read in place: a buffer of this context's pool from a class the peer may read
            // (a buffer of another context's pool has keys the peer cannot use).
            Payload::Buf(b) if b.capacity() >= self.cfg.rndv_threshold && self.pool.owns(&b) => {
                RndvSrc::Buf(b)
            }
            Payload::Shared(b) => RndvSrc::Shared(self.regcache.register(&b)?),
            Payload::SharedBuf(b)
                if b.buf().capacity() >= self.cfg.rndv_threshold && self.pool.owns(b.buf()) =>
            {
                RndvSrc::SharedBuf(b)
            }
            // A copy, in a buffer the peer may read: from the classes at or above our own
            // threshold, also when the peer's lower eager limit made this a rendezvous.
            other => match self.pool.try_alloc(len.max(self.cfg.rndv_threshold)) {
                Ok(mut b) => {
                    b.set_len(len)?;
                    other.copy_to(&mut b);
                    RndvSrc::Buf(b)
                }
                Err(Error::WouldBlock) => return Ok(Some(other)),
                Err(e) => return Err(e),
            },
        };
        // What the peer reads: exactly this buffer's bytes.
        let sge = match &src {
            RndvSrc::Buf(b) => b.sge(self.post_key),
            RndvSrc::Shared(r) => r.sge(),
            RndvSrc::SharedBuf(b) => b.buf().sge(self.post_key),
        };
        let src_addr = sge.addr();
        let zero_copy = matches!(src, RndvSrc::Shared(_));
        let ep = &mut st.eps[k];
        // Confinement: the peer gets a key to exactly this buffer, until it reports the
        // read done (the window is deallocated then, before the buffer is released). The
        // registration's key, which opens the whole chunk (other buffers, other peers'
        // data), never leaves the process.
        let (src_rkey, mw) = if self.confine {
            // RC: a type 2 window, usable from the endpoint's queue pair only.
            let mw = self.pd.alloc_mw(MwType::Type2)?;
            let key = mw.rkey().inc();
            let bind = mw.bind_wr_sge(key, &sge, AccessFlags::REMOTE_READ)?;
            post_on(
                ep,
                WrOpcode::BindMw(bind),
                PostData::Buf(self.post_key),
                Hold::None,
                false,
            )?;
            (key.0, Some(mw))
        } else if self.confine_xrc {
            // XRC: the peer reads through our target queue pair, which has no send queue
            // to bind a type 2 window with; a type 1 window bound through the initiator.
            let mw = self.pd.alloc_mw(MwType::Type1)?;
            let key = post_bind1(ep, &mw, &sge)?;
            (key.0, Some(mw))
        } else {
            let rkey = match &src {
                RndvSrc::Buf(b) => b.rkey(self.post_key),
                RndvSrc::Shared(r) => r.rkey(),
                RndvSrc::SharedBuf(b) => b.buf().rkey(self.post_key),
            };
            (rkey.0, None)
        };
        let mut hdr = Self::next_header(ep, Kind::Rts, len);
        if ep.rndv_out.len() + 1 >= window {
            hdr.flags |= Header::WAKE_ON_READ;
        }
        let mut frame = [0u8; RTS_LEN];
        hdr.write(&mut frame);
        RtsInfo {
            addr: src_addr,
            rkey: src_rkey,
        }
        .write(&mut frame);
        spend_credit(ep, cx.worker().clock());
        post_on(
            ep,
            WrOpcode::Send,
            PostData::Inline(&frame),
            Hold::None,
            false,
        )?;
        ep.rndv_out.push_back(RndvOut {
            _window: mw,
            _src: src,
        });
        tracing::trace!(
            endpoint = ep.id,
            len,
            "send: rendezvous (the peer RDMA-reads the buffer)"
        );
        if !st.rndv_watch.contains(&k) {
            st.rndv_watch.push(k);
        }
        st.stats.sent_rndv += 1;
        if zero_copy {
            st.stats.sent_zero_copy += 1;
        }
        Ok(None)
    }

    /// Adds a small message to endpoint `k`'s packed frame, opening one (with a credit of
    /// its own) if needed. False when that is not possible now (no credit, send slot or
    /// pool buffer): the message then takes the ordinary path, after any open frame.
    fn pack(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, data: &[u8]) -> Result<bool> {
        let Some(ep) = st.eps.get_mut(k) else {
            return Ok(false);
        };
        // The frame must fit the peer's receive buffer as an eager message does.
        let eager_limit = self.cfg.rndv_threshold.min(ep.peer_eager_limit);
        let cap = PACK_MAX.min(eager_limit.saturating_sub(1));
        if let Some(b) = ep.pack.as_mut() {
            let at = b.len();
            let end = at + PACKED_ENTRY_LEN + data.len();
            if end <= HEADER_LEN + cap && b.set_len(end).is_ok() {
                let _ = PackedEntries::append(b, at, data);
                st.stats.sent_packed += 1;
                return Ok(true);
            }
            // Full: it goes now, and a new one starts.
            if !self.flush_pack(st, k)? {
                return Ok(false);
            }
        }
        let Some(ep) = st.eps.get_mut(k) else {
            return Ok(false);
        };
        if PACKED_ENTRY_LEN + data.len() > cap
            || ep.sq_used() + 2 >= ep.sq_depth
            || !self.has_credit(st, cx, k)
        {
            return Ok(false);
        }
        let ep = &mut st.eps[k];
        let Ok(mut b) = self.pool.try_alloc(HEADER_LEN + cap) else {
            return Ok(false);
        };
        let end = HEADER_LEN + PACKED_ENTRY_LEN + data.len();
        if b.set_len(end).is_err() || PackedEntries::append(&mut b, HEADER_LEN, data).is_none() {
            return Ok(false);
        }
        spend_credit(ep, cx.worker().clock());
        ep.pack = Some(b);
        st.packs.push(k);
        st.stats.sent_packed += 1;
        Self::not_starving(st, k);
        // However the batch is used, the frame goes within PACK_HOLD.
        let due = cx.now() + PACK_HOLD;
        st.arm(cx, k, Timer::PackFlush, due);
        Ok(true)
    }

    /// True when endpoint `k` holds a credit for its peer, after reading its mailbox if it
    /// seemed to hold none (grants written there raise no completion).
    fn has_credit(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) -> bool {
        if st.eps.get(k).is_some_and(|ep| ep.send.available() == 0) {
            self.read_mailbox(st, cx, k);
        }
        st.eps.get(k).is_some_and(|ep| ep.send.available() > 0)
    }

    /// Endpoint `k` has a credit to send with: it no longer waits for one, and the peer
    /// is told if it had been told otherwise (see `recall.rs`).
    fn not_starving(st: &mut State, k: usize) {
        let Some(ep) = st.eps.get_mut(k) else { return };
        ep.recall.starved_since = None;
        ep.timers.clear(Timer::Starving);
        if ep.recall.starving {
            ep.recall.starving = false;
            super::recall::write_recall(st, k);
        }
    }

    /// Posts endpoint `k`'s packed frame, if it has one. False when the send queue has no
    /// room now (the frame stays, and goes with the next progress).
    pub(crate) fn flush_pack(&self, st: &mut State, k: usize) -> Result<bool> {
        let Some(ep) = st.eps.get_mut(k) else {
            return Ok(true);
        };
        let Some(mut b) = ep.pack.take() else {
            return Ok(true);
        };
        ep.timers.clear(Timer::PackFlush);
        if matches!(ep.status, Status::Down(_)) {
            // Lost with the endpoint, like the messages already posted on it.
            st.packs.retain(|&x| x != k);
            return Ok(true);
        }
        if ep.sq_used() + 1 >= ep.sq_depth {
            // (Its flush timer is cleared: the progress that frees the send slot sends it.)
            ep.pack = Some(b);
            return Ok(false);
        }
        // A frame that holds one message (a batch that sent one: a server's answer to a
        // lone call) leaves as that message, inline, on the credit the frame took: cheaper
        // than a frame from a pool buffer, the same bytes at the peer.
        let payload = b.get(HEADER_LEN..).unwrap_or_default();
        if let Some(r) = PackedEntries::entry_at(payload, 0)
            && r.end == payload.len()
        {
            st.packs.retain(|&x| x != k);
            return Self::post_inline(&mut st.eps[k], &payload[r]).map(|()| true);
        }
        let hdr = Header {
            kind: Kind::Packed,
            tag: ep.peer_tag,
            grant: ep.recv.advertise(),
            rndv_done: ep.rndv_in_done,
            len: (b.len() - HEADER_LEN) as u32,
            flags: 0,
        };
        ep.rndv_in_adv = ep.rndv_in_done;
        hdr.write(&mut b);
        st.packs.retain(|&x| x != k);
        let ep = &mut st.eps[k];
        post_on(
            ep,
            WrOpcode::Send,
            PostData::Buf(self.post_key),
            Hold::Buf(b),
            true,
        )?;
        st.stats.packed_frames += 1;
        tracing::trace!(
            endpoint = ep.id,
            bytes = hdr.len,
            "send: packed frame (small messages of a send batch in one SEND)"
        );
        Ok(true)
    }

    /// Posts every open packed frame (`flush_pack` drops those of endpoints that are down).
    pub(crate) fn flush_packs(&self, st: &mut State) {
        for k in std::mem::take(&mut st.packs) {
            match self.flush_pack(st, k) {
                Ok(true) => {}
                Ok(false) => st.packs.push(k),
                Err(e) => tracing::debug!("posting a packed frame failed: {e}"),
            }
        }
    }

    /// Posts a one-sided operation; returns its sequence number, or `None` when the send
    /// queue is full.
    pub(crate) fn post_op(
        &self,
        st: &mut State,
        k: usize,
        op: WrOpcode,
        local: OpSource,
    ) -> Result<std::result::Result<u32, OpSource>> {
        let Some(ep) = st.eps.get_mut(k) else {
            return Err(Error::Disconnected(DisconnectCause::LocalClose));
        };
        if let Some(c) = ep.down_cause() {
            return Err(Error::Disconnected(c));
        }
        // Messages sent before the operation go before it.
        if !self.flush_pack(st, k)? {
            return Ok(Err(local));
        }
        let ep = &mut st.eps[k];
        if ep.sq_used() + 2 >= ep.sq_depth {
            return Ok(Err(local));
        }
        let seq = ep.next_seq;
        let data = match local {
            OpSource::None => PostData::Inline(&[]),
            OpSource::Buf(_) | OpSource::Shared(_) => PostData::Buf(self.post_key),
        };
        post_on(ep, op, data, Hold::Op(local), true)?;
        Ok(Ok(seq))
    }
}

/// Where a posted work request's data comes from.
pub(crate) enum PostData<'a> {
    /// Copied into the work request.
    Inline(&'a [u8]),
    /// The buffer in the `Hold` (its first `len()` bytes), named with the transport's key.
    Buf(PostKey),
}

/// Posts a type 1 bind of `mw` over `sge` (remote read) on `ep`'s queue pair, numbered and
/// signaled like [`post_on`]'s requests; returns the window's new key.
fn post_bind1(
    ep: &mut Ep,
    mw: &rdmx_verbs::MemoryWindow,
    sge: &rdmx_verbs::Sge,
) -> Result<rdmx_verbs::Rkey> {
    let seq = ep.next_seq;
    let signal = ep.unsignaled + 1 >= SIGNAL_EVERY || ep.sq_used() + 1 >= ep.sq_depth / 2;
    let flags = if signal {
        SendFlags::SIGNALED
    } else {
        SendFlags::EMPTY
    };
    let wr_id = wrid::make(wrid::SEND, ep.key, seq);
    let key = ep
        .qp
        .bind_mw_sge(mw, wr_id, flags, sge, AccessFlags::REMOTE_READ)?;
    ep.next_seq = seq.wrapping_add(1);
    ep.unsignaled = if signal { 0 } else { ep.unsignaled + 1 };
    ep.inflight.push_back((seq, Hold::None));
    if signal {
        ep.signaled_out += 1;
    }
    Ok(key)
}

/// Posts one send work request on `ep`, numbering it and keeping what it holds until it
/// completes. Signals when asked, when it holds something, or every `SIGNAL_EVERY` requests.
pub(crate) fn post_on(
    ep: &mut Ep,
    op: WrOpcode,
    data: PostData<'_>,
    hold: Hold,
    signal: bool,
) -> Result<()> {
    let seq = ep.next_seq;
    let signal = signal
        || !matches!(hold, Hold::None)
        || ep.unsignaled + 1 >= SIGNAL_EVERY
        || ep.sq_used() + 1 >= ep.sq_depth / 2;
    let sge;
    let mut wr = match (&data, &hold) {
        (PostData::Inline(bytes), _) => {
            let mut wr = SendWr::new(wrid::make(wrid::SEND, 0, seq), op, &[]);
            wr.inline_data = Some(*bytes);
            wr.send_flags |= SendFlags::INLINE;
            wr
        }
        (PostData::Buf(key), Hold::Buf(b) | Hold::Op(OpSource::Buf(b))) => {
            sge = b.sge(*key);
            SendWr::new(
                wrid::make(wrid::SEND, 0, seq),
                op,
                std::slice::from_ref(&sge),
            )
        }
        (PostData::Buf(_), Hold::Op(OpSource::Shared(r))) => {
            sge = r.sge();
            SendWr::new(
                wrid::make(wrid::SEND, 0, seq),
                op,
                std::slice::from_ref(&sge),
            )
        }
        (PostData::Buf(_), _) => SendWr::new(wrid::make(wrid::SEND, 0, seq), op, &[]),
    };
    wr.wr_id = wrid::make(wrid::SEND, ep.key, seq);
    wr.remote_srqn = ep.remote_srqn;
    if signal {
        wr.send_flags |= SendFlags::SIGNALED;
    }
    ep.qp.post_send(&wr)?;
    ep.next_seq = seq.wrapping_add(1);
    ep.unsignaled = if signal { 0 } else { ep.unsignaled + 1 };
    ep.inflight.push_back((seq, hold));
    if signal {
        ep.signaled_out += 1;
    }
    Ok(())
}
