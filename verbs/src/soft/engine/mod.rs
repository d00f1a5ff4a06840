//! The soft NIC's transport engine, sans-I/O.
//!
//! [`Nic`] holds everything a NIC holds — protection domains, the memory table, completion
//! queues and queue pairs with their requester, responder and completer state — and never
//! touches a socket, a thread or a clock. The driver feeds it:
//!
//! * **(C) commands**: `create_*`, `modify_qp`, `post_send`, `post_recv`, `req_notify_cq` …
//! * **(B) inputs**: [`Nic::handle_datagram`] for every received UDP payload and
//!   [`Nic::handle_timeout`] when the time from [`Nic::poll_timeout`] has come;
//! * **(D) outputs**, to be drained after every input or command, in this order:
//!   [`Nic::poll_transmit`] until `None` (packets to send), then [`Nic::poll_event`]
//!   (asynchronous events) and [`Nic::poll_cq_notify`] (completion-channel wake-ups), then
//!   [`Nic::poll_timeout`] (when to call `handle_timeout` next).
//!
//! `now` is nanoseconds since an arbitrary epoch and must never go backwards. Spurious
//! `handle_timeout` calls are harmless. Randomness (QP numbers, keys) comes from the seed in
//! [`NicConfig`], so a simulation with a given seed is exactly reproducible.
//!
//! Peers are adversaries: a malformed, misaddressed or out-of-window packet is dropped and
//! counted in [`NicCounters`], or answered with a NAK; nothing on the network path panics.

mod apm;
mod foreign;
#[doc(hidden)]
pub mod fuzz_api;
mod idmap;
mod lists;
mod mw;
mod post;
mod qp;
mod requester;
mod responder;
mod rng;
mod srq;
mod tm;
mod uc;
mod ud;

#[cfg(test)]
mod hostile;
#[cfg(test)]
mod sim;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use idmap::IdMap;
pub(crate) use lists::{InlineBytes, OneOrMany};

use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::soft::wire::{self, IcrcPath, PacketHeaders, Transport};
use crate::types::{AccessFlags, Gid, QpAttr, QpAttrMask, QpCap, QpType, Qpn, WorkCompletion};
use crate::wr::{RecvWr, SendWr, Sge};

pub use crate::vocab::SrqState;
pub use crate::vocab::{AsyncEvent, NicCounters, QpConfig};
pub(crate) use qp::Qp;
pub use rng::Rng;
pub use tm::MAX_NUM_TAGS;

/// Static configuration of a soft NIC.
#[derive(Debug, Clone)]
pub struct NicConfig {
    /// One entry per port: the local address (IP and UDP port) the port sends from and
    /// listens on. Port `n` (1-based) is `ports[n - 1]`; its GID (index 0) is its IP.
    pub ports: Vec<SocketAddr>,
    /// Seed for QP numbers and memory keys.
    pub seed: u64,
    /// Check the ICRC of received packets (assumes IPv4 ID 0 + DF, spec §1.7).
    pub verify_icrc: bool,
    /// Largest inline payload a QP may request.
    pub max_inline_data: u32,
    /// Requester window: packets in flight per QP before waiting for ACKs.
    pub max_unacked_psns: u32,
    /// Active MTU of each port (largest UD message; upper bound of a QP's path MTU).
    pub port_mtus: Vec<crate::types::Mtu>,
    /// Treat `retry_cnt = 7` as "retry forever", as Linux rxe does. The verbs documents
    /// define 7 = infinite only for `rnr_retry`, so the default is false (seven retries).
    pub infinite_retry_at_7: bool,
}

impl NicConfig {
    /// A configuration for a one-port NIC at `addr`.
    pub fn single_port(addr: SocketAddr, seed: u64) -> Self {
        Self {
            ports: vec![addr],
            seed,
            verify_icrc: true,
            max_inline_data: 1024,
            max_unacked_psns: 256,
            infinite_retry_at_7: false,
            port_mtus: vec![crate::types::Mtu::Mtu4096],
        }
    }
}

/// A packet ready to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Local port index (0-based) whose socket sends it.
    pub port: usize,
    /// Destination address (remote IP and UDP port).
    pub dst: SocketAddr,
    /// Bytes written at the start of the caller's buffer (a whole UDP payload).
    pub len: usize,
}

/// A memory table entry.
#[derive(Debug)]
pub(crate) struct MrEntry {
    pub(crate) pd: u32,
    pub(crate) mem: Arc<RegisteredMemory>,
    pub(crate) access: AccessFlags,
    /// Memory windows bound to the region.
    pub(crate) windows: u32,
    /// Its owner deregistered it while windows were bound: no local access, and it goes
    /// when the last window closes.
    pub(crate) orphaned: bool,
}

impl MrEntry {
    pub(crate) fn new(pd: u32, mem: Arc<RegisteredMemory>, access: AccessFlags) -> Self {
        Self {
            pd,
            mem,
            access,
            windows: 0,
            orphaned: false,
        }
    }
}

/// A resolved piece of local memory: a registered buffer and a byte range inside it.
#[derive(Debug, Clone)]
pub(crate) struct Seg {
    pub(crate) mem: Arc<RegisteredMemory>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

/// Where a message's bytes live.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    Segs(OneOrMany<Seg>),
    Inline(InlineBytes),
}

impl Payload {
    /// Copies message bytes `[msg_off, msg_off + dst.len())` into `dst`.
    pub(crate) fn gather(&self, msg_off: usize, dst: &mut [u8]) {
        match self {
            Self::Inline(v) => {
                if let Some(src) = v.get(msg_off..msg_off + dst.len()) {
                    dst.copy_from_slice(src);
                }
            }
            Self::Segs(segs) => {
                let mut pos = 0usize;
                let mut done = 0usize;
                for s in segs.iter() {
                    if done == dst.len() {
                        break;
                    }
                    let want = msg_off + done;
                    if want < pos + s.len {
                        let inner = want - pos;
                        let n = (s.len - inner).min(dst.len() - done);
                        s.mem.read(s.off + inner, &mut dst[done..done + n]);
                        done += n;
                    }
                    pos += s.len;
                }
            }
        }
    }
}

/// Scatters `src` into `segs` at message offset `msg_off`. Returns false when the segments
/// are too short.
pub(crate) fn scatter(segs: &[Seg], msg_off: usize, src: &[u8]) -> bool {
    let mut pos = 0usize;
    let mut done = 0usize;
    for s in segs {
        if done == src.len() {
            break;
        }
        let want = msg_off + done;
        if want < pos + s.len {
            let inner = want - pos;
            let n = (s.len - inner).min(src.len() - done);
            s.mem.write(s.off + inner, &src[done..done + n]);
            done += n;
        }
        pos += s.len;
    }
    done == src.len()
}

/// Completion queue state.
#[derive(Debug)]
struct Cq {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    /// Armed for the next completion (`Some(solicited_only)`), or not armed.
    armed: Option<bool>,
    overflowed: bool,
}

/// NIC-wide resources the QP state machines use.
#[derive(Debug)]
pub(crate) struct Resources {
    pub(crate) cfg: NicConfig,
    pub(crate) mrs: IdMap<MrEntry>,
    cqs: IdMap<Cq>,
    pub(crate) srqs: IdMap<srq::Srq>,
    /// Memory windows, by index (a window key's upper 24 bits).
    pub(crate) mws: IdMap<mw::MwEntry>,
    pub(crate) mcast: HashMap<Gid, Vec<u32>>,
    pub(crate) events: VecDeque<AsyncEvent>,
    cq_notify: VecDeque<u32>,
    pub(crate) counters: NicCounters,
    pub(crate) rng: Rng,
    /// CQs standing in for another process's CQs (a shared XRC domain this NIC hosts):
    /// their completions are handed to the driver instead of being queued.
    forward_cqs: std::collections::HashSet<u32>,
    /// Completions for forwarding CQs: (CQ, completion, solicited).
    forwarded: Vec<(u32, WorkCompletion, bool)>,
}

impl Resources {
    pub(crate) fn cqs_contains(&self, cq: u32) -> bool {
        self.cqs.contains_key(&cq)
    }

    /// Resolves an SGE list for local access under `pd`. `write` asks for LOCAL_WRITE.
    pub(crate) fn resolve(&self, pd: u32, sges: &[Sge], write: bool) -> Option<OneOrMany<Seg>> {
        let mut out = OneOrMany::new();
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let e = self.mrs.get(&s.lkey.0)?;
            if e.pd != pd || e.orphaned || (write && !e.access.contains(AccessFlags::LOCAL_WRITE)) {
                return None;
            }
            let off = s.addr.checked_sub(e.mem.addr())?;
            let end = off.checked_add(u64::from(s.length))?;
            if end > e.mem.len() as u64 {
                return None;
            }
            out.push(Seg {
                mem: e.mem.clone(),
                off: off as usize,
                len: s.length as usize,
            });
        }
        Some(out)
    }

    /// Checks a remote access (`rkey`, `va`, `len`, permission) by QP `qpn` under `pd`,
    /// through a memory region or a memory window; returns the memory and the offset of
    /// `va` in it.
    pub(crate) fn remote(
        &self,
        qpn: Qpn,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(Arc<RegisteredMemory>, usize)> {
        if rkey & mw::WINDOW_BIT != 0 {
            return self.window(qpn, pd, rkey, va, len, need);
        }
        let e = self.mrs.get(&rkey)?;
        if e.pd != pd || e.orphaned || !e.access.contains(need) {
            return None;
        }
        let off = va.checked_sub(e.mem.addr())?;
        if off.checked_add(len)? > e.mem.len() as u64 {
            return None;
        }
        Some((e.mem.clone(), off as usize))
    }

    /// Delivers a completion to CQ `cq`. `solicited` marks completions that satisfy a
    /// solicited-only notification request.
    pub(crate) fn complete(&mut self, cq: u32, wc: WorkCompletion, solicited: bool) {
        if !self.forward_cqs.is_empty() && self.forward_cqs.contains(&cq) {
            self.forwarded.push((cq, wc, solicited));
            return;
        }
        let Some(c) = self.cqs.get_mut(&cq) else {
            return;
        };
        if c.entries.len() >= c.capacity {
            self.counters.cq_overflows += 1;
            if !c.overflowed {
                c.overflowed = true;
                self.events.push_back(AsyncEvent::CqError(cq));
            }
            return;
        }
        c.entries.push_back(wc);
        let fire = match c.armed {
            Some(true) => solicited || wc.status != crate::types::WcStatus::Success,
            Some(false) => true,
            None => false,
        };
        if fire {
            c.armed = None;
            self.cq_notify.push_back(cq);
        }
    }
}

/// The sans-I/O soft NIC. See the module documentation for the calling protocol.
#[derive(Debug)]
pub struct Nic {
    res: Resources,
    qps: IdMap<Qp>,
    tx_ready: VecDeque<u32>,
    /// QPs that may hold a coalesced ACK (see [`Nic::flush_acks`]).
    held_acks: Vec<u32>,
    /// Frames built for queue pairs that no longer exist (the last coalesced ACK of a
    /// destroyed QP), sent before anything else.
    outbox: VecDeque<(Transmit, Vec<u8>)>,
    /// QPs that may have a timer armed (pruned by `poll_timeout`).
    timed: Vec<u32>,
    /// The earliest timer of `timed` as `poll_timeout` last found it, valid while
    /// `timers_dirty` is false: a driver that polls an idle device in a loop asks for it at
    /// every look, and finding it means a pass over every QP with a timer (a hundred
    /// connections made that pass a tenth of a busy process's time).
    timer_min: Option<u64>,
    /// Something that may have moved a timer happened since `timer_min` was found (set by
    /// every call that touches a QP).
    timers_dirty: bool,
    next_pd: u32,
    next_cq: u32,
    next_xrcd: u32,
}

impl Nic {
    /// A NIC with no objects.
    pub fn new(cfg: NicConfig) -> Self {
        let rng = Rng::new(cfg.seed);
        Self {
            res: Resources {
                cfg,
                mrs: IdMap::default(),
                cqs: IdMap::default(),
                srqs: IdMap::default(),
                mws: IdMap::default(),
                mcast: HashMap::new(),
                events: VecDeque::new(),
                cq_notify: VecDeque::new(),
                forward_cqs: std::collections::HashSet::new(),
                forwarded: Vec::new(),
                counters: NicCounters::default(),
                rng,
            },
            qps: IdMap::default(),
            tx_ready: VecDeque::new(),
            held_acks: Vec::new(),
            outbox: VecDeque::new(),
            timed: Vec::new(),
            timer_min: None,
            timers_dirty: true,
            next_pd: 1,
            next_cq: 1,
            next_xrcd: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &NicConfig {
        &self.res.cfg
    }

    /// See [`NicConfig::infinite_retry_at_7`].
    pub fn set_infinite_retry_at_7(&mut self, on: bool) {
        self.res.cfg.infinite_retry_at_7 = on;
    }

    /// Turns the ICRC check of received packets on or off.
    pub fn set_verify_icrc(&mut self, on: bool) {
        self.res.cfg.verify_icrc = on;
    }

    /// The counters.
    pub fn counters(&self) -> NicCounters {
        self.res.counters
    }

    /// GID of port `port` (1-based).
    pub fn gid(&self, port: u8) -> Option<Gid> {
        let p = self.res.cfg.ports.get(usize::from(port).checked_sub(1)?)?;
        Some(Gid::from_ip(p.ip()))
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> u32 {
        let pd = self.next_pd;
        self.next_pd = self.next_pd.wrapping_add(1).max(1);
        pd
    }

    /// Registers `mem` under `pd`; returns the key (lkey = rkey), unpredictable.
    pub fn reg_mr(&mut self, pd: u32, mem: Arc<RegisteredMemory>, access: AccessFlags) -> u32 {
        loop {
            let key = self.res.rng.next_u32() & !mw::WINDOW_BIT;
            if self.res.mr_key_free(key) {
                self.res.mrs.insert(key, MrEntry::new(pd, mem, access));
                return key;
            }
        }
    }

    /// Removes a registration; later accesses with its key fail with protection errors. A
    /// region with memory windows bound stays (for the windows only) until they close.
    pub fn dereg_mr(&mut self, key: u32) -> bool {
        match self.res.mrs.get_mut(&key) {
            Some(e) if e.windows > 0 => {
                e.orphaned = true;
                true
            }
            Some(_) => self.res.mrs.remove(&key).is_some(),
            None => false,
        }
    }

    /// Creates a completion queue of `cqe` entries.
    pub fn create_cq(&mut self, cqe: usize) -> u32 {
        let id = self.next_cq;
        self.next_cq = self.next_cq.wrapping_add(1).max(1);
        self.res.cqs.insert(
            id,
            Cq {
                entries: VecDeque::new(),
                capacity: cqe.max(1),
                armed: None,
                overflowed: false,
            },
        );
        id
    }

    /// Destroys a completion queue.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<(), VerbsError> {
        if self
            .qps
            .values()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(VerbsError::InvalidArgument(
                "completion queue is still used by a queue pair".into(),
            ));
        }
        self.res.cqs.remove(&cq);
        Ok(())
    }

    /// Pops up to `out.len()` completions from `cq`.
    pub fn poll_cq(&mut self, cq: u32, out: &mut [WorkCompletion]) -> usize {
        let Some(c) = self.res.cqs.get_mut(&cq) else {
            return 0;
        };
        let mut n = 0;
        while n < out.len() {
            match c.entries.pop_front() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// Completions waiting in `cq`.
    pub fn cq_len(&self, cq: u32) -> usize {
        self.res.cqs.get(&cq).map_or(0, |c| c.entries.len())
    }

    /// Arms `cq` for one notification (`ibv_req_notify_cq`). If matching completions are
    /// already queued the notification fires at once, so a waiter cannot miss them.
    pub fn req_notify_cq(&mut self, cq: u32, solicited_only: bool) {
        if let Some(c) = self.res.cqs.get_mut(&cq) {
            if !c.entries.is_empty() && !solicited_only {
                self.res.cq_notify.push_back(cq);
                c.armed = None;
            } else {
                c.armed = Some(solicited_only);
            }
        }
    }

    /// Creates a queue pair.
    pub fn create_qp(&mut self, c: &QpConfig) -> Result<Qpn, VerbsError> {
        self.timers_dirty = true;
        let QpConfig {
            pd,
            qp_type,
            send_cq,
            recv_cq,
            cap,
            sq_sig_all,
            srq,
            xrcd,
            // Every operation is available on every QP of this NIC that has it.
            send_ops: _,
        } = *c;
        if !matches!(
            qp_type,
            QpType::Rc | QpType::Uc | QpType::Ud | QpType::XrcSend | QpType::XrcRecv
        ) {
            return Err(VerbsError::Unsupported(
                "this QP type (RC, UC, UD and XRC are supported)",
            ));
        }
        if qp_type == QpType::XrcRecv && xrcd.is_none() {
            return Err(VerbsError::InvalidArgument(
                "an XRC target QP needs an XRC domain".into(),
            ));
        }
        if let Some(id) = srq
            && !self.res.srqs.contains_key(&id)
        {
            return Err(VerbsError::NoSuchObject("shared receive queue"));
        }
        let cqs_needed: &[u32] = match qp_type {
            QpType::XrcRecv => &[],
            QpType::XrcSend => &[send_cq],
            _ => &[send_cq, recv_cq],
        };
        if cqs_needed.iter().any(|cq| !self.res.cqs.contains_key(cq)) {
            return Err(VerbsError::NoSuchObject("completion queue"));
        }
        if cap.max_inline_data > self.res.cfg.max_inline_data {
            return Err(VerbsError::InvalidAttribute {
                attr: "max_inline_data",
                reason: format!(
                    "{} exceeds the device limit {}",
                    cap.max_inline_data, self.res.cfg.max_inline_data
                ),
            });
        }
        if cap.max_send_wr == 0 && cap.max_recv_wr == 0 && srq.is_none() && xrcd.is_none() {
            return Err(VerbsError::InvalidAttribute {
                attr: "cap",
                reason: "a QP needs a send or a receive queue".into(),
            });
        }
        if self.qps.len() >= 1 << 20 {
            return Err(VerbsError::ResourceExhausted("queue pairs"));
        }
        let qpn = loop {
            let n = self.res.rng.next_u32() & 0x00FF_FFFF;
            if n >= 16 && n != 0x00FF_FFFF && !self.qps.contains_key(&n) {
                break n;
            }
        };
        let mut qp = Qp::new(Qpn(qpn), qp_type, pd, send_cq, recv_cq, cap, sq_sig_all);
        qp.srq = srq;
        qp.xrcd = xrcd;
        self.qps.insert(qpn, qp);
        self.res.counters.qps_created += 1;
        Ok(Qpn(qpn))
    }

    /// Destroys a queue pair; its outstanding work requests are discarded. An ACK it was
    /// holding back for coalescing is sent first: the requester already saw its message
    /// delivered here, and without the ACK it would retry until it gives up.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> bool {
        self.timers_dirty = true;
        let Some(mut qp) = self.qps.remove(&qpn.0) else {
            return false;
        };
        self.res.counters.qps_destroyed += 1;
        self.res.unbind_qp(qpn);
        if qp.resp.has_held_ack() {
            qp.resp.release_ack();
            let mut buf = vec![0u8; 512];
            if let Some(t) = qp.poll_response(&mut self.res, &mut buf) {
                buf.truncate(t.len);
                self.outbox.push_back((t, buf));
            }
        }
        true
    }

    /// Changes QP attributes (`ibv_modify_qp`), with the verbs state-machine checks.
    pub fn modify_qp(
        &mut self,
        now: u64,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        self.timers_dirty = true;
        let qp = self
            .qps
            .get_mut(&qpn.0)
            .ok_or(VerbsError::NoSuchObject("queue pair"))?;
        qp.modify(now, &mut self.res, attr, mask)?;
        Self::after_op(&mut self.tx_ready, &mut self.timed, qp);
        Ok(())
    }

    /// Current QP attributes (`ibv_query_qp`).
    pub fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        self.qps.get(&qpn.0).map(|q| (q.attr, q.cap))
    }

    /// Posts a send work request.
    pub fn post_send(&mut self, now: u64, qpn: Qpn, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.timers_dirty = true;
        let qp = self.qps.get_mut(&qpn.0).ok_or(PostError::Destroyed)?;
        let _ = now;
        qp.post_send(&mut self.res, wr)?;
        if wr.opcode.is_local() {
            qp.run_posted_local_ops(&mut self.res);
        }
        Self::after_op(&mut self.tx_ready, &mut self.timed, qp);
        Ok(())
    }

    /// Posts a batch whole or not at all (`ibv_wr_complete`).
    pub fn post_send_all(
        &mut self,
        qpn: Qpn,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        self.timers_dirty = true;
        let qp = self.qps.get_mut(&qpn.0).ok_or((0, PostError::Destroyed))?;
        qp.post_send_all(&mut self.res, wrs)?;
        if wrs.iter().any(|w| w.opcode.is_local()) {
            qp.run_posted_local_ops(&mut self.res);
        }
        Self::after_op(&mut self.tx_ready, &mut self.timed, qp);
        Ok(())
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.timers_dirty = true;
        let qp = self.qps.get_mut(&qpn.0).ok_or(PostError::Destroyed)?;
        qp.post_recv(&mut self.res, wr)
    }

    /// After anything that may have changed a QP: queue it for transmission and register
    /// its timers, so neither `poll_transmit` nor `poll_timeout` has to scan every QP.
    fn after_op(tx_ready: &mut VecDeque<u32>, timed: &mut Vec<u32>, qp: &mut Qp) {
        if !qp.in_tx_ready && qp.wants_transmit() {
            qp.in_tx_ready = true;
            tx_ready.push_back(qp.qpn.0);
        }
        if !qp.in_timed && qp.next_timeout().is_some() {
            qp.in_timed = true;
            timed.push(qp.qpn.0);
        }
    }

    /// Handles one received UDP payload that arrived on local port index `port` from `src`,
    /// addressed to `dst` (the port's address, or a multicast group).
    pub fn handle_datagram(
        &mut self,
        now: u64,
        port: usize,
        src: SocketAddr,
        dst: IpAddr,
        data: &[u8],
    ) {
        self.timers_dirty = true;
        self.res.counters.rx_packets += 1;
        if port >= self.res.cfg.ports.len() {
            self.res.counters.rx_bad_addr += 1;
            return;
        }
        if self.res.cfg.verify_icrc {
            let path = IcrcPath {
                src,
                dst: SocketAddr::new(dst, wire::ROCE_UDP_PORT),
            };
            if !wire::icrc::verify(&path, data) {
                self.res.counters.rx_bad_icrc += 1;
                return;
            }
        }
        let Ok((hdr, payload)) = PacketHeaders::parse(data) else {
            self.res.counters.rx_malformed += 1;
            return;
        };
        match hdr.bth.opcode.transport() {
            Transport::Rc | Transport::Uc | Transport::Xrc => {}
            Transport::Ud => {
                self.deliver_ud(src, dst, &hdr, payload, data.len());
                return;
            }
            _ => {
                // CNPs: this NIC runs no congestion control.
                self.res.counters.rx_no_qp += 1;
                return;
            }
        }
        if dst.is_multicast() {
            self.res.counters.rx_no_group += 1;
            return;
        }
        let Some(qp) = self.qps.get_mut(&hdr.bth.dest_qp) else {
            self.res.counters.rx_no_qp += 1;
            return;
        };
        qp.handle_packet(now, &mut self.res, port, src, &hdr, payload);
        if qp.resp.has_held_ack() && !self.held_acks.contains(&qp.qpn.0) {
            self.held_acks.push(qp.qpn.0);
        }
        Self::after_op(&mut self.tx_ready, &mut self.timed, qp);
    }

    /// True when some QP may hold a coalesced ACK.
    pub fn has_held_acks(&self) -> bool {
        !self.held_acks.is_empty()
    }

    /// Releases the ACKs held back for coalescing for at least `min_age` ns. A driver calls
    /// this when it has drained its sockets (no more packets to coalesce with); without it,
    /// held ACKs go out after at most `ACK_DELAY_NS` through `handle_timeout`. A small
    /// `min_age` keeps a ping-pong from paying an ACK packet (a send and a receive system
    /// call) per message: ACKs of consecutive messages coalesce.
    pub fn flush_acks(&mut self, now: u64, min_age: u64) {
        self.timers_dirty = true;
        let qps = &mut self.qps;
        let (tx_ready, timed) = (&mut self.tx_ready, &mut self.timed);
        self.held_acks.retain(|qpn| {
            let Some(qp) = qps.get_mut(qpn) else {
                return false;
            };
            match qp.resp.held_since() {
                Some(t) if now.saturating_sub(t) < min_age => true,
                Some(_) => {
                    qp.resp.release_ack();
                    Self::after_op(tx_ready, timed, qp);
                    false
                }
                None => false,
            }
        });
    }

    /// Handles expired timers (retransmission, RNR wait, held ACKs). Harmless when nothing
    /// expired.
    pub fn handle_timeout(&mut self, now: u64) {
        self.timers_dirty = true;
        for i in 0..self.timed.len() {
            let Some(qp) = self.timed.get(i).and_then(|q| self.qps.get_mut(q)) else {
                continue;
            };
            if qp.next_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now, &mut self.res);
                if !qp.in_tx_ready && qp.wants_transmit() {
                    qp.in_tx_ready = true;
                    self.tx_ready.push_back(qp.qpn.0);
                }
            }
        }
    }

    /// The earliest time `handle_timeout` has work to do. Takes `&mut self` to forget QPs
    /// whose timers are all off.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        if !self.timers_dirty {
            return self.timer_min;
        }
        let qps = &mut self.qps;
        let mut min: Option<u64> = None;
        self.timed.retain(|q| {
            let Some(qp) = qps.get_mut(q) else {
                return false;
            };
            match qp.next_timeout() {
                Some(t) => {
                    min = Some(min.map_or(t, |m| m.min(t)));
                    true
                }
                None => {
                    qp.in_timed = false;
                    false
                }
            }
        });
        self.timer_min = min;
        self.timers_dirty = false;
        min
    }

    /// The earliest timer found by a pass over every QP (what `poll_timeout` caches), for
    /// the simulations to check the cache against.
    #[cfg(test)]
    pub(crate) fn timeout_uncached(&self) -> Option<u64> {
        self.qps.values().filter_map(Qp::next_timeout).min()
    }

    /// Writes the next packet to send into `buf` (which must hold a whole packet: path MTU +
    /// 128 bytes is enough). Returns `None` when nothing is ready.
    pub fn poll_transmit(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        self.timers_dirty = true;
        if let Some((t, frame)) = self.outbox.pop_front()
            && let Some(dst) = buf.get_mut(..frame.len())
        {
            dst.copy_from_slice(&frame);
            self.res.counters.tx_packets += 1;
            self.res.counters.tx_bytes += t.len as u64;
            return Some(t);
        }
        while let Some(qpn) = self.tx_ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let sent = qp.poll_transmit(now, &mut self.res, buf);
            if !qp.in_timed && qp.next_timeout().is_some() {
                // Sending armed the retransmission timer.
                qp.in_timed = true;
                self.timed.push(qpn);
            }
            match sent {
                Some(t) => {
                    self.res.counters.tx_packets += 1;
                    self.res.counters.tx_bytes += t.len as u64;
                    self.tx_ready.push_back(qpn);
                    return Some(t);
                }
                None => qp.in_tx_ready = false,
            }
        }
        None
    }

    /// A human-readable dump of every QP's transport state, for debugging.
    pub fn debug_dump(&self) -> String {
        let mut s = format!("{:?}\n", self.res.counters);
        for qp in self.qps.values() {
            s.push_str(&format!(
                "QP {} {:?} sq={} cursor={} rq={} req={:?} resp={}\n",
                qp.qpn,
                qp.attr.qp_state,
                qp.req.sq.len(),
                qp.req.cursor,
                qp.resp.rq.len(),
                qp.req.summary(),
                qp.resp.summary()
            ));
            for w in qp.req.sq.iter().take(4) {
                s.push_str(&format!(
                    "   wqe {} {:?} started={} first={} npsn={} len={}\n",
                    w.wr_id, w.kind, w.started, w.first_psn, w.npsn, w.len
                ));
            }
        }
        s
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.res.events.pop_front()
    }

    /// True when the NIC has something for its driver: a packet to send (queued or a QP
    /// ready to transmit), a completion-channel wake-up, an event or a completion to forward.
    /// Operations such as posting a receive usually leave it false, and the driver then skips
    /// its flush.
    pub fn has_output(&self) -> bool {
        !self.outbox.is_empty()
            || !self.tx_ready.is_empty()
            || !self.res.cq_notify.is_empty()
            || !self.res.events.is_empty()
            || !self.res.forwarded.is_empty()
    }

    /// The next completion queue whose notification fired.
    pub fn poll_cq_notify(&mut self) -> Option<u32> {
        self.res.cq_notify.pop_front()
    }
}
