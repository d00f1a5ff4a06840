//! One side of a test round: completion queue, RC or UD queue pair and memory region, the
//! QP state transitions, posting, and bounded completion polling.

mod ud;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use rdmx::verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Gid, MemoryRegion, Mtu, ProtectionDomain,
    QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, Rkey, SendFlags, SendWr,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

use super::Transport;
use super::exchange::{self, EndpointInfo, Msg};
pub(crate) use super::spec::{EpSpec, Layout, Role};
use crate::error::{Error, Result, ResultExt};

/// A wait without any completion (or other progress) for this long is an error.
pub(crate) const PROGRESS_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle wait checks whether the peer gave up.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// How [`Endpoint::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The condition holds.
    Done,
    /// Nothing completed for the given quiet time.
    Quiet,
    /// The peer wrote on the side channel (left unread).
    PeerSpoke,
}

/// A send-queue operation of the tests; buffers follow [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Send the transmit buffer.
    Send,
    /// Write the transmit buffer into the peer's receive buffer.
    Write,
    /// Same, with immediate data (consumes a receive at the peer).
    WriteImm(u32),
    /// Read the peer's transmit buffer into the receive buffer.
    Read,
    /// Fetch-and-add 1 on the peer's first word; the old value lands in the receive buffer.
    FetchAdd,
    /// A send with no payload and this immediate (UD send_bw credits).
    Credit(u32),
}

/// One side's verbs resources and counters for a round.
#[derive(Debug)]
pub(crate) struct Endpoint {
    // Field order is drop order: the QP goes before its CQ and memory.
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    ctx: Context,
    /// UD: the path to the peer (after `connect`).
    ud: Option<ud::UdPeer>,
    pd: ProtectionDomain,
    transport: Transport,
    layout: Layout,
    psn: u32,
    port_mtu: Mtu,
    remote: Option<EndpointInfo>,
    busy: bool,
    wcs: Vec<WorkCompletion>,
    watch: Option<TcpStream>,
    sq_depth: u32,
    rx_depth: u32,
    inline_size: u32,
    recv_len: Option<u32>,
    recvs_posted: u64,
    /// Send work requests posted (the next send `wr_id`).
    pub(crate) sends_posted: u64,
    /// One past the `wr_id` of the newest send completion (completions come in order).
    pub(crate) sends_done: u64,
    /// Receive completions.
    pub(crate) recvs_done: u64,
    /// The newest receive completion.
    pub(crate) last_recv: WorkCompletion,
}

impl Endpoint {
    /// Creates the CQ, the QP (moved to INIT), the memory region (filled with the pattern)
    /// and posts the initial receives. `watch` is the side channel, checked while waiting so
    /// that a peer that gave up ends the wait at once.
    pub(crate) fn new(
        ctx: &Context,
        pd: &ProtectionDomain,
        spec: &EpSpec,
        busy: bool,
        watch: Option<TcpStream>,
    ) -> Result<Self> {
        let dev = ctx.query_device();
        // A device-wide inline limit of 0 means "unknown" (libibverbs has none): ask for what
        // we want and use what the QP was granted.
        let mut inline_size = if dev.max_inline_data > 0 {
            spec.inline_size.min(dev.max_inline_data)
        } else {
            spec.inline_size
        };
        let cqe = (spec.sq_depth + spec.rx_depth + 16) as usize;
        let cq = ctx
            .create_cq(cqe, None)
            .ctx("creating a completion queue")?;
        let mut init = match spec.transport {
            Transport::Rc => QpInitAttr::rc(&cq, &cq),
            Transport::Ud => QpInitAttr::ud(&cq, &cq),
        };
        init.cap = QpCap {
            max_send_wr: spec.sq_depth,
            max_recv_wr: spec.rx_depth.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inline_size,
        };
        let qp = match pd.create_qp(&init) {
            Ok(qp) => qp,
            Err(_) if inline_size > 0 => {
                // The device refused the inline size: fall back to no inline sends.
                init.cap.max_inline_data = 0;
                pd.create_qp(&init)
                    .with_ctx(|| format!("creating a {} queue pair", spec.transport.upper()))?
            }
            Err(e) => {
                return Err(e)
                    .with_ctx(|| format!("creating a {} queue pair", spec.transport.upper()));
            }
        };
        inline_size = match qp.query() {
            Ok((_, cap)) => inline_size.min(cap.max_inline_data),
            Err(_) => init.cap.max_inline_data,
        };
        let layout = Layout::new(spec.size, spec.transport);
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd
            .reg_mr(layout.len, access)
            .with_ctx(|| format!("registering a {}-byte memory region", layout.len))?;
        if let Some(seed) = spec.seed {
            mr.write(layout.tx_off, &super::pattern(seed, layout.size))
                .ctx("filling the transmit buffer")?;
        }
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        match spec.transport {
            Transport::Rc => {
                attr.qp_access_flags = access;
                mask |= QpAttrMask::ACCESS_FLAGS;
            }
            Transport::Ud => {
                attr.qkey = ud::QKEY;
                mask |= QpAttrMask::QKEY;
            }
        }
        qp.modify(&attr, mask).ctx("moving the QP to INIT")?;
        let port_mtu = ctx.query_port(1).ctx("querying port 1")?.active_mtu;
        let mut ep = Self {
            qp,
            cq,
            mr,
            ctx: ctx.clone(),
            ud: None,
            pd: pd.clone(),
            transport: spec.transport,
            layout,
            psn: super::random_psn(),
            port_mtu,
            remote: None,
            busy,
            wcs: vec![WorkCompletion::EMPTY; 64],
            watch,
            sq_depth: spec.sq_depth,
            rx_depth: spec.rx_depth,
            inline_size,
            recv_len: spec.recv_len,
            recvs_posted: 0,
            sends_posted: 0,
            sends_done: 0,
            recvs_done: 0,
            last_recv: WorkCompletion::EMPTY,
        };
        for _ in 0..spec.rx_depth {
            ep.post_recv()?;
        }
        Ok(ep)
    }

    /// What the peer needs to know about this side.
    pub(crate) fn info(&self) -> Result<EndpointInfo> {
        let gid = self.ctx.query_gid(1, 0).ctx("querying GID 0 of port 1")?;
        let addr = self
            .ctx
            .port_addr(1)
            .ctx("querying the UDP address of port 1")?;
        Ok(EndpointInfo {
            qpn: self.qp.qp_num().0,
            psn: self.psn,
            gid: gid.0,
            udp_port: addr.port(),
            mtu: self.port_mtu.bytes() as u32,
            mr_addr: self.mr.addr(),
            mr_rkey: self.mr.rkey().0,
            mr_len: self.mr.len() as u64,
        })
    }

    /// The path MTU used with `remote`: the smaller of both ports' active MTUs.
    fn path_mtu(&self, remote: &EndpointInfo) -> Result<Mtu> {
        let bytes = (remote.mtu as usize).min(self.port_mtu.bytes()).min(4096);
        Mtu::from_bytes_floor(bytes)
            .ok_or_else(|| Error::msg(format!("peer's MTU {} is below 256 bytes", remote.mtu)))
    }

    /// Connects the QP to `remote`: INIT -> RTR -> RTS (UD: and makes the address handle).
    pub(crate) fn connect(&mut self, remote: &EndpointInfo) -> Result<()> {
        if self.transport == Transport::Ud {
            return self.connect_ud(remote);
        }
        if (remote.mr_len as usize) < self.layout.len {
            return Err(Error::msg(format!(
                "peer's memory region has {} bytes, the test needs {}",
                remote.mr_len, self.layout.len
            )));
        }
        let dev = self.ctx.query_device();
        let rd_atomic = dev.max_qp_rd_atom.min(dev.max_qp_init_rd_atom).min(16) as u8;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr::new(Gid(remote.gid)).with_udp_port(remote.udp_port),
            path_mtu: self.path_mtu(remote)?,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 12,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER;
        self.qp.modify(&rtr, mask).ctx("moving the QP to RTR")?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: self.psn,
            max_rd_atomic: rd_atomic,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC;
        self.qp.modify(&rts, mask).ctx("moving the QP to RTS")?;
        self.remote = Some(*remote);
        Ok(())
    }

    /// UD queue pair (as opposed to RC).
    pub(crate) fn is_ud(&self) -> bool {
        self.transport == Transport::Ud
    }

    /// The buffer layout.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// The path MTU in bytes (after `connect`).
    pub(crate) fn mtu(&self) -> u32 {
        self.remote
            .and_then(|r| self.path_mtu(&r).ok())
            .map_or(0, |m| m.bytes() as u32)
    }

    /// The memory region.
    pub(crate) fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The device context.
    pub(crate) fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// Busy polling (as opposed to blocking waits).
    pub(crate) fn busy(&self) -> bool {
        self.busy
    }

    /// Polls the CQ once without waiting (running the soft NIC on this thread).
    pub(crate) fn poll_nowait(&mut self) -> Result<usize> {
        let busy = std::mem::replace(&mut self.busy, true);
        let r = self.poll_once(Duration::ZERO);
        self.busy = busy;
        r
    }

    /// Switches between busy polling and blocking waits.
    pub(crate) fn set_busy(&mut self, busy: bool) {
        self.busy = busy;
    }

    fn post_recv(&mut self) -> Result<()> {
        let l = self.layout;
        let sge = [self.mr.sge(l.rx_off, l.grh + l.size)];
        let wr = RecvWr::new(self.recvs_posted, &sge);
        self.qp.post_recv(&wr).ctx("posting a receive")?;
        self.recvs_posted += 1;
        Ok(())
    }

    /// The work request opcode and local buffer of `op`.
    fn wr_parts(&self, op: Op) -> Result<(WrOpcode, usize, usize, bool)> {
        let l = self.layout;
        let r = self
            .remote
            .ok_or_else(|| Error::msg("posting before the QP is connected"))?;
        let rkey = Rkey(r.mr_rkey);
        let rx = r.mr_addr + l.rx_off as u64;
        let tx = r.mr_addr + l.tx_off as u64;
        let inline = l.size <= self.inline_size as usize;
        Ok(match op {
            Op::Send => (WrOpcode::Send, l.tx_off, l.size, inline),
            Op::Write => (
                WrOpcode::RdmaWrite {
                    remote_addr: rx,
                    rkey,
                },
                l.tx_off,
                l.size,
                inline,
            ),
            Op::WriteImm(imm) => {
                let opc = WrOpcode::RdmaWriteWithImm {
                    remote_addr: rx,
                    rkey,
                    imm,
                };
                (opc, l.tx_off, l.size, inline)
            }
            Op::Read => (
                WrOpcode::RdmaRead {
                    remote_addr: tx,
                    rkey,
                },
                l.rx_off,
                l.size,
                false,
            ),
            Op::FetchAdd => {
                let opc = WrOpcode::AtomicFetchAdd {
                    remote_addr: tx,
                    rkey,
                    add: 1,
                };
                (opc, l.rx_off, 8, false)
            }
            Op::Credit(imm) => (WrOpcode::SendWithImm { imm }, l.tx_off, 0, false),
        })
    }

    /// Posts `count` work requests doing `op`; `signaled(i)` says whether the one with
    /// `wr_id` `i` asks for a completion. Waits for room in the send queue first.
    pub(crate) fn post(
        &mut self,
        op: Op,
        count: u64,
        signaled: impl Fn(u64) -> bool,
    ) -> Result<()> {
        let (opcode, off, len, inline) = self.wr_parts(op)?;
        let depth = u64::from(self.sq_depth);
        if self.sends_posted - self.sends_done + count > depth {
            let need = (self.sends_posted + count).saturating_sub(depth);
            self.wait_until("room in the send queue", |e| Ok(e.sends_done >= need))?;
        }
        let sge = [self.mr.sge(off, len)];
        let mut flags = SendFlags::EMPTY;
        if inline {
            flags |= SendFlags::INLINE;
        }
        let wrs: Vec<SendWr<'_>> = (self.sends_posted..self.sends_posted + count)
            .map(|id| {
                let f = if signaled(id) {
                    flags | SendFlags::SIGNALED
                } else {
                    flags
                };
                let wr = SendWr::new(id, opcode, &sge).flags(f);
                match &self.ud {
                    Some(peer) => wr.to(&peer.ah, peer.qpn, ud::QKEY),
                    None => wr,
                }
            })
            .collect();
        let r = if let [wr] = wrs.as_slice() {
            self.qp.post_send(wr).map_err(|e| (0, e))
        } else {
            self.qp.post_send_batch(&wrs)
        };
        match r {
            Ok(()) => {
                self.sends_posted += count;
                Ok(())
            }
            Err((n, e)) => {
                self.sends_posted += n as u64;
                Err(Error::with_source(
                    format!("posting work request {}", self.sends_posted),
                    e,
                ))
            }
        }
    }

    /// Posts one signaled `op`.
    pub(crate) fn post_one(&mut self, op: Op) -> Result<()> {
        self.post(op, 1, |_| true)
    }

    fn on_completion(&mut self, wc: WorkCompletion) -> Result<()> {
        if wc.status != WcStatus::Success {
            return Err(Error::msg(format!(
                "work completion error: {} (status {}) for wr_id {} ({:?}, vendor_err {:#x})",
                wc.status,
                wc.status.code(),
                wc.wr_id,
                wc.opcode,
                wc.vendor_err
            )));
        }
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                if let Some(want) = self.recv_len {
                    let want = want + self.layout.grh as u32;
                    if wc.byte_len != want {
                        return Err(Error::msg(format!(
                            "receive wr_id {} got {} bytes, expected {want}",
                            wc.wr_id, wc.byte_len
                        )));
                    }
                }
                if let Some(peer) = &self.ud
                    && wc.src_qp != peer.qpn
                {
                    return Err(Error::msg(format!(
                        "datagram from {}, expected one from the peer's {}",
                        wc.src_qp, peer.qpn
                    )));
                }
                self.recvs_done += 1;
                self.last_recv = wc;
                if self.rx_depth > 0 {
                    self.post_recv()?;
                }
            }
            _ => {
                if wc.wr_id >= self.sends_posted || wc.wr_id < self.sends_done {
                    return Err(Error::msg(format!(
                        "unexpected send completion wr_id {} (posted {}, completed {})",
                        wc.wr_id, self.sends_posted, self.sends_done
                    )));
                }
                self.sends_done = wc.wr_id + 1;
            }
        }
        Ok(())
    }

    /// Polls once (busy mode) or waits up to `wait` (blocking mode); handles what came.
    fn poll_once(&mut self, wait: Duration) -> Result<usize> {
        let n = if self.busy {
            self.cq.poll(&mut self.wcs)
        } else {
            self.cq
                .poll_blocking(&mut self.wcs, wait)
                .ctx("waiting on the completion channel")?
        };
        for i in 0..n {
            let wc = self.wcs[i];
            self.on_completion(wc)?;
        }
        Ok(n)
    }

    /// Polls until `done` holds. Fails when nothing completes for [`PROGRESS_TIMEOUT`] or the
    /// peer reports an error on the side channel.
    pub(crate) fn wait_until(
        &mut self,
        what: &str,
        done: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<()> {
        self.wait(what, None, false, done).map(|_| ())
    }

    /// Polls until `done` holds, or (with `quiet`) until nothing completed for that long, or
    /// (with `peer_ends`) until the peer writes on the side channel, leaving the message
    /// unread. Fails when nothing completes for [`PROGRESS_TIMEOUT`], and (without
    /// `peer_ends`) when the peer reports an error.
    pub(crate) fn wait(
        &mut self,
        what: &str,
        quiet: Option<Duration>,
        peer_ends: bool,
        mut done: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<Waited> {
        let block = quiet.map_or(WATCH_EVERY, |q| q.min(WATCH_EVERY));
        let mut idle_since: Option<Instant> = None;
        let mut last_watch = Instant::now();
        let mut spins = 0u32;
        loop {
            if done(self)? {
                return Ok(Waited::Done);
            }
            if self.poll_once(block)? > 0 {
                idle_since = None;
                spins = 0;
                continue;
            }
            spins = spins.wrapping_add(1);
            if self.busy && !spins.is_multiple_of(256) {
                continue;
            }
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if quiet.is_some_and(|q| now - since >= q) {
                if !peer_ends {
                    self.check_peer(what)?;
                }
                return Ok(Waited::Quiet);
            }
            if now - since >= PROGRESS_TIMEOUT {
                return Err(Error::msg(format!(
                    "timed out waiting for {what} (nothing completed for {} s)",
                    PROGRESS_TIMEOUT.as_secs()
                )));
            }
            if now - last_watch >= WATCH_EVERY {
                last_watch = now;
                if peer_ends && self.watch.as_ref().is_some_and(exchange::peer_spoke) {
                    return Ok(Waited::PeerSpoke);
                }
                self.check_peer(what)?;
            }
        }
    }

    /// Fails if the peer has written to the side channel (it only does that on error) or
    /// closed it while we wait on the data path.
    fn check_peer(&self, what: &str) -> Result<()> {
        let Some(s) = &self.watch else {
            return Ok(());
        };
        if !exchange::peer_spoke(s) {
            return Ok(());
        }
        let mut r = s;
        match exchange::read_msg(&mut r, "a message") {
            Ok(Msg::Error(e)) => Err(Error::msg(format!(
                "peer reported an error while we waited for {what}: {e}"
            ))),
            Ok(m) => Err(Error::msg(format!(
                "protocol error: peer sent {} while we waited for {what}",
                m.kind()
            ))),
            Err(e) => Err(Error::msg(format!(
                "side channel failed while waiting for {what}: {e}"
            ))),
        }
    }

    /// Waits for every posted send to complete.
    pub(crate) fn drain_sends(&mut self) -> Result<()> {
        let want = self.sends_posted;
        self.wait_until("the last send completions", |e| Ok(e.sends_done >= want))
    }

    /// Byte `off` of the memory region.
    pub(crate) fn byte(&self, off: usize) -> Result<u8> {
        let mut b = [0u8; 1];
        self.mr.read(off, &mut b).ctx("reading the memory region")?;
        Ok(b[0])
    }
}
