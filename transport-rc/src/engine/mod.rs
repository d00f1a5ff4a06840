//! The RC progress engine: the methods of [`Shared`] that run under the worker's lock on the
//! transport's [`State`]. One layer, one type, its methods split by topic: this file routes
//! completions (`progress`, `after`, the receive/send/signal handlers); `grants.rs` (receive
//! buffers and credits), `rndv.rs` (rendezvous reads and mailboxes), `recall.rs` (credit
//! recall), `send.rs` (sending, packed frames), `teardown.rs` (failing and removing
//! endpoints), `inbox.rs` (handing messages out) and `keepalive.rs` (probes and close
//! deadlines). It knows the state below it (`state.rs`, `ep.rs`, `wire.rs`), nothing of how
//! endpoints are set up or handed to the application.

mod grants;
mod inbox;
mod keepalive;
pub(crate) mod recall;
mod rndv;
pub(crate) mod send;
mod teardown;

pub(crate) use keepalive::{load_alternate, rearm, run_timers, start_keepalive, timeout_exponent};

use std::sync::Arc;
use std::time::Duration;

use rdmx_core::header::{HEADER_LEN, Header, Kind, PackedEntries, RtsInfo};
use rdmx_core::worker::Cx;
use rdmx_core::{Buf, DisconnectCause};
use rdmx_verbs::{WcOpcode, WcStatus, WorkCompletion};

use crate::ep::{Hold, Inbound, OpResult, OpSource, Status, wrid};
use crate::state::{POLL_BATCH, Shared, State};
use crate::wire::{Mailbox, Signal};

impl Shared {
    /// Something happened on endpoint `k` (a message, a completion, credits, a state
    /// change): its waiters spin on, and its sleepers wake ([`Cx::touch`]).
    pub(crate) fn touch(st: &mut State, cx: &mut Cx<'_>, k: usize) {
        if let Some(ep) = st.eps.get_mut(k) {
            cx.touch(&mut ep.wait);
        }
    }

    /// Records activity on endpoint `k` without waking its sleepers ([`Cx::stir`]).
    pub(crate) fn stir(st: &mut State, cx: &mut Cx<'_>, k: usize) {
        if let Some(ep) = st.eps.get_mut(k) {
            cx.stir(&mut ep.wait);
        }
    }

    /// The background thread's tick (keepalives, credit recall).
    pub(crate) fn keepalive_tick(&self) -> Duration {
        (self.cfg.peer_timeout / 4).min(Duration::from_millis(100))
    }

    // ----------------------------------------------------------------- progress

    /// Polls the completion queue dry (bounded), routes completions, then does the
    /// follow-up work: refill the shared receive queue, hand out credits, write mailboxes,
    /// post deferred rendezvous reads. Returns the number of completions handled.
    pub(crate) fn progress(&self, st: &mut State, cx: &mut Cx<'_>) -> usize {
        let mut total = 0;
        for _ in 0..8 {
            let mut wc = std::mem::take(&mut st.wc);
            let n = self.cq.poll(&mut wc);
            for c in &wc[..n] {
                self.on_completion(st, cx, c);
            }
            st.wc = wc;
            total += n;
            if n < POLL_BATCH {
                break;
            }
        }
        self.check_mailboxes(st, cx);
        self.after(st, cx);
        total
    }

    /// Follow-up work after state changed.
    pub(crate) fn after(&self, st: &mut State, cx: &mut Cx<'_>) {
        // Whoever makes progress (a thread that waits or polls, the background thread)
        // sends the packed frames still open: they wait for no more than that. Except a
        // thread inside a send batch of its own: it may be draining what came in and
        // answering it (its answers share frames); it flushes when the batch ends, or
        // before it waits (`wait_until`), and the pack timer bounds the hold in any case.
        if !st.packs.is_empty() && !cx.worker().batch_open() {
            self.flush_packs(st);
        }
        // While every buffer is promised and some endpoint is below its window (or a peer
        // starves), a thread that makes progress anyway also looks at the starving flags,
        // every WATCH_SCAN (PRESSURE_SCAN): the background thread backs off to its tick
        // while nothing arrives, and a newcomer with no credit would wait for it. (The
        // condition is checked here too, not only at the scans that set `recall_watch`: a
        // context whose last buffer was just promised must not wait for a tick to start.)
        let scarce = st.budget.spare() == 0 && !st.needy.is_empty();
        if st.recall_watch || st.recall_pressure || scarce {
            let now = cx.now();
            let every = if st.recall_pressure {
                recall::PRESSURE_SCAN
            } else {
                recall::WATCH_SCAN
            };
            if st
                .recall_scanned_at
                .is_none_or(|t| now.duration_since(t) >= every)
            {
                st.recall_scanned_at = Some(now);
                recall::tick(self, st, cx, now);
            }
        }
        if self.batch_posts {
            // Posting may be a round trip to another process: grant what is already
            // posted first, so that senders do not wait on it.
            self.distribute(st);
        }
        self.refill(st);
        self.distribute(st);
        self.post_deferred_reads(st, cx);
        self.flush_mailboxes(st);
        if st.reap_pending {
            self.reap(st, cx);
        }
    }

    fn on_completion(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        match wrid::kind(c.wr_id) {
            wrid::RECV => self.on_recv(st, cx, c),
            wrid::SEND => self.on_send(st, cx, c),
            wrid::READ => self.on_read(st, cx, c),
            _ => {}
        }
    }

    /// An RDMA WRITE with immediate: a [`Signal`] (the only use rdmx makes of them). It
    /// used a credit and a receive buffer, which goes back to the queue untouched.
    fn on_signal(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion, buf: Buf) {
        let qpn = c.qp_num.0;
        let routed = c.imm().and_then(Signal::from_imm).and_then(|(sig, tag)| {
            let k = usize::from(tag);
            st.eps
                .get(k)
                .is_some_and(|e| e.recv_qpn == qpn)
                .then_some((sig, k))
        });
        let Some((sig, k)) = routed else {
            st.stats.stray_completions += 1;
            st.stats.protocol_errors += 1;
            tracing::debug!(qpn, imm = ?c.imm(), "unexpected RDMA WRITE with immediate");
            if let Some(&k) = st.by_qpn.get(&qpn) {
                self.fail(
                    st,
                    cx,
                    k,
                    DisconnectCause::Protocol("unexpected RDMA WRITE with immediate".into()),
                );
            }
            self.repost(st, buf);
            return;
        };
        Self::touch(st, cx, k);
        let credited = Self::take_credit(st, k);
        self.repost(st, buf);
        if !credited {
            st.stats.protocol_errors += 1;
            self.fail(
                st,
                cx,
                k,
                DisconnectCause::Protocol("signal without a credit".into()),
            );
            return;
        }
        self.mark_needy(st, k);
        match sig {
            // The mailbox word landed before the completion.
            Signal::ReadDone => self.read_mailbox(st, cx, k),
            Signal::RecallReturned => recall::on_signal(self, st, cx, k, true),
            Signal::RecallRequest => recall::on_signal(self, st, cx, k, false),
        }
    }

    /// The peer of endpoint `k` opened its mailbox slot (its bootstrap `Ready`, or any
    /// message, which follows its window's bind on its queue pair): what waited to be
    /// written there goes now.
    pub(crate) fn peer_is_ready(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) {
        let Some(ep) = st.eps.get_mut(k) else { return };
        if ep.peer_ready {
            return;
        }
        ep.peer_ready = true;
        if !st.dirty.contains(&k) {
            st.dirty.push(k);
        }
        self.after(st, cx);
    }

    /// The peer of endpoint `k` used one of our credits (its buffer was already counted as
    /// consumed). False when it had none: a protocol violation.
    fn take_credit(st: &mut State, k: usize) -> bool {
        let ok = st.eps.get_mut(k).is_some_and(|ep| ep.recv.on_receive());
        if ok {
            st.budget.outstanding = st.budget.outstanding.saturating_sub(1);
        }
        ok
    }

    /// A receive completion: a signal, or a message for the endpoint its header names.
    fn on_recv(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        let slot = wrid::key(c.wr_id);
        let Some(buf) = st.recv_slots.try_remove(slot) else {
            return;
        };
        st.budget.posted = st.budget.posted.saturating_sub(1);
        st.recv_seen += 1;
        if c.status == WcStatus::Success && c.opcode == WcOpcode::RecvRdmaWithImm {
            self.on_signal(st, cx, c, buf);
            return;
        }
        let Some((k, hdr, buf)) = self.route(st, cx, c, buf) else {
            return;
        };
        // A rendezvous request wakes nobody: its message is deliverable only once read, and
        // the read completion wakes the receiver then (a thread waiting for a message used to
        // wake here for nothing, then again for the read). Senders it gives credits to are
        // woken below.
        if hdr.kind == Kind::Rts {
            Self::stir(st, cx, k);
        } else {
            Self::touch(st, cx, k);
        }
        // Any message from the peer follows the bind of its slot's window.
        if !st.eps[k].peer_ready {
            self.peer_is_ready(st, cx, k);
        }
        // The peer used one of our credits.
        let credited = {
            let ep = &mut st.eps[k];
            ep.last_rx = cx.now();
            ep.keepalive_at = None;
            Self::take_credit(st, k)
        };
        if !credited {
            self.refuse(st, cx, k, buf, "message without a credit".into());
            return;
        }
        self.mark_needy(st, k);
        let counters = Mailbox {
            grant: hdr.grant,
            rndv_done: hdr.rndv_done,
        };
        let freed = match self.apply_peer_counters(st, k, counters) {
            Ok(f) => f,
            Err(why) => {
                self.refuse(st, cx, k, buf, why);
                return;
            }
        };
        if freed && hdr.kind == Kind::Rts {
            Self::touch(st, cx, k);
        }
        match hdr.kind {
            Kind::Data => {
                st.held += 1;
                self.deliver(
                    st,
                    cx,
                    k,
                    Inbound::Msg {
                        buf,
                        off: HEADER_LEN,
                    },
                );
            }
            Kind::Packed => self.on_packed(st, cx, k, &hdr, buf),
            Kind::Rts => self.on_rts(st, cx, k, &hdr, buf),
            Kind::Close => {
                self.repost(st, buf);
                let ep = &mut st.eps[k];
                ep.peer_closed = true;
                ep.inbox.push_back(Inbound::Closed);
                if ep.status == Status::Open {
                    // Answer with our own Close once our sends drain (see `reap`).
                    ep.status = Status::Closing;
                }
                st.reap_pending = true;
            }
        }
    }

    /// Finds the endpoint a received message is for: by the header's tag (XRC needs it: one
    /// target queue pair carries the messages of every endpoint behind a remote initiator),
    /// checked against the queue pair the message came through. A message that belongs to
    /// no endpoint is counted and its buffer reposted; an RC message whose header is
    /// unreadable is still traced to its endpoint by its queue pair, to take that endpoint
    /// down.
    fn route(
        &self,
        st: &mut State,
        cx: &mut Cx<'_>,
        c: &WorkCompletion,
        mut buf: Buf,
    ) -> Option<(usize, Header, Buf)> {
        let qpn = c.qp_num.0;
        let parsed = if c.status == WcStatus::Success && buf.set_len(c.byte_len as usize).is_ok() {
            Some(Header::parse(&buf))
        } else {
            None
        };
        let by_tag = match &parsed {
            Some(Ok(h)) => Some(usize::from(h.tag)),
            _ => st.by_qpn.get(&qpn).copied(),
        };
        let key = by_tag.filter(|&k| st.eps.get(k).is_some_and(|e| e.recv_qpn == qpn));
        if let (Some(Ok(h)), Some(k)) = (&parsed, key) {
            return Some((k, *h, buf));
        }
        st.stats.stray_completions += 1;
        tracing::debug!(
            status = ?c.status,
            qpn,
            opcode = ?c.opcode,
            byte_len = c.byte_len,
            tag = ?by_tag,
            recv_qpn = ?by_tag.and_then(|k| st.eps.get(k)).map(|e| e.recv_qpn),
            header_ok = matches!(parsed, Some(Ok(_))),
            "stray receive completion"
        );
        let cause = match parsed {
            Some(Err(e)) => {
                st.stats.protocol_errors += 1;
                Some(DisconnectCause::Protocol(e.to_string()))
            }
            None if c.status != WcStatus::WrFlushErr => {
                tracing::debug!(status = ?c.status, qpn, "receive completion error");
                Some(DisconnectCause::TransportError(format!("{:?}", c.status)))
            }
            _ => None,
        };
        if let (Some(k), Some(cause)) = (key, cause) {
            self.fail(st, cx, k, cause);
        }
        self.repost(st, buf);
        None
    }

    /// The peer of endpoint `k` broke the protocol with the message in `buf`: the endpoint
    /// goes down, the buffer back to the queue.
    fn refuse(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, buf: Buf, why: String) {
        st.stats.protocol_errors += 1;
        self.fail(st, cx, k, DisconnectCause::Protocol(why));
        self.repost(st, buf);
    }

    /// Queues something deliverable for endpoint `k`, and the endpoint for receives on the
    /// whole context.
    fn deliver(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, what: Inbound) {
        if let Some(ep) = st.eps.get_mut(k) {
            ep.inbox.push_back(what);
            cx.mark_ready(&mut ep.wait);
        }
    }

    /// A packed frame: several small messages in one receive buffer, handed out as views of
    /// it.
    fn on_packed(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, hdr: &Header, buf: Buf) {
        let end = HEADER_LEN + hdr.len as usize;
        let Some((_, count)) = buf.get(HEADER_LEN..end).and_then(PackedEntries::parse) else {
            self.refuse(st, cx, k, buf, "malformed packed frame".into());
            return;
        };
        tracing::trace!(endpoint = st.eps[k].id, count, "received a packed frame");
        st.held += 1;
        self.deliver(
            st,
            cx,
            k,
            Inbound::Packed {
                frame: Arc::new(buf),
                off: HEADER_LEN,
                end,
            },
        );
    }

    /// A rendezvous request: queued in order, and its read posted once a destination
    /// buffer is free (`post_deferred_reads`).
    fn on_rts(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, hdr: &Header, buf: Buf) {
        let rts = RtsInfo::parse(&buf);
        self.repost(st, buf);
        let Some(rts) = rts else { return };
        if hdr.len as usize > self.cfg.max_message {
            st.stats.protocol_errors += 1;
            self.fail(
                st,
                cx,
                k,
                DisconnectCause::Protocol(format!(
                    "rendezvous message of {} bytes exceeds max_message",
                    hdr.len
                )),
            );
            return;
        }
        let ep = &mut st.eps[k];
        ep.rndv_queued += 1;
        ep.rndv_in_seen = ep.rndv_in_seen.wrapping_add(1);
        if hdr.flags & Header::WAKE_ON_READ != 0 {
            let outstanding = ep.rndv_in_seen.wrapping_sub(ep.rndv_in_done);
            ep.rndv_wake_at = Some(ep.rndv_in_done.wrapping_add(outstanding.div_ceil(2)));
        }
        ep.inbox.push_back(Inbound::Rndv {
            len: hdr.len,
            rts,
            dest: None,
            posted: false,
            done: false,
        });
        if !st.rndv_wait.contains(&k) {
            st.rndv_wait.push(k);
        }
    }

    fn on_send(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        let k = wrid::key(c.wr_id);
        Self::touch(st, cx, k);
        let seq = wrid::seq(c.wr_id);
        let Some(ep) = st.eps.get_mut(k) else { return };
        if ep.qpn != c.qp_num.0 {
            return;
        }
        ep.signaled_out = ep.signaled_out.saturating_sub(1);
        // On an RC queue pair completions are in order: everything up to `seq` is done.
        while let Some((s, _)) = ep.inflight.front() {
            let s = *s;
            if rdmx_core::header::seq_after(s, seq) {
                break;
            }
            let Some((s, hold)) = ep.inflight.pop_front() else {
                break;
            };
            if let Hold::Op(src) = hold {
                let buf = match src {
                    OpSource::Buf(b) => Some(b),
                    OpSource::None | OpSource::Shared(_) => None,
                };
                let status = if s == seq {
                    c.status
                } else {
                    WcStatus::Success
                };
                ep.op_done(OpResult {
                    seq: s,
                    status,
                    buf,
                });
            }
        }
        if c.status != WcStatus::Success {
            let cause = match c.status {
                WcStatus::RetryExcErr => {
                    DisconnectCause::PeerUnreachable("transport retries exhausted".into())
                }
                WcStatus::RnrRetryExcErr => {
                    DisconnectCause::PeerUnreachable("receiver not ready, retries exhausted".into())
                }
                WcStatus::RemAccessErr if c.opcode == WcOpcode::RdmaWrite => {
                    // A one-sided write the application asked for: reported to the caller,
                    // but the QP is in the error state now, so the endpoint is down too.
                    DisconnectCause::TransportError("remote access error".into())
                }
                s => DisconnectCause::TransportError(format!("{s:?}")),
            };
            if c.status != WcStatus::WrFlushErr || ep.is_open() {
                self.fail_qp(st, cx, c.qp_num.0, cause);
            }
        }
    }

    /// A queue pair broke: every endpoint sending on it goes down (one for RC; all the
    /// endpoints behind an XRC initiator), and a broken initiator is forgotten so the next
    /// connection to that node makes a new one.
    pub(crate) fn fail_qp(
        &self,
        st: &mut State,
        cx: &mut Cx<'_>,
        qpn: u32,
        cause: DisconnectCause,
    ) {
        let keys: Vec<usize> = st
            .eps
            .iter()
            .filter(|(_, e)| e.qpn == qpn)
            .map(|(k, _)| k)
            .collect();
        let broken: Vec<u64> = st
            .initiators
            .iter()
            .filter(|(_, i)| i.qp.qp_num().0 == qpn)
            .map(|(&node, _)| node)
            .collect();
        st.initiators.retain(|_, i| i.qp.qp_num().0 != qpn);
        for k in keys {
            self.fail(st, cx, k, cause.clone());
        }
        for peer_node in broken {
            self.drop_targets_of(peer_node);
        }
    }

    /// Our XRC initiator towards `peer_node` broke, and with it every endpoint of ours to
    /// that node; those endpoints' peers may be alive (a process of a shared node died,
    /// and the others' receive queues went with nothing of theirs). They cannot be told
    /// through the broken initiator, and their own initiators still reach our targets, so
    /// they would wait for ever. Tearing down the targets that receive from that node
    /// makes their sends and keepalives exhaust their retries: they see `PeerUnreachable`
    /// within their peer timeout. Only when this context is alone on its node: another
    /// context of the node may have live endpoints behind the same targets.
    fn drop_targets_of(&self, peer_node: u64) {
        let Some(node) = &self.node else { return };
        let alone = {
            let mut ctxs = node.contexts.lock();
            ctxs.retain(|w| w.strong_count() > 0);
            ctxs.len() <= 1
        };
        if alone {
            let n = node.drop_targets_from(peer_node);
            tracing::debug!(
                peer_node,
                n,
                "XRC initiator broke: its node's targets dropped"
            );
        }
    }
}
