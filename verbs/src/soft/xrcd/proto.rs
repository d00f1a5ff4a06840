//! The frames a shared XRC domain's host and its members exchange over their local
//! `SOCK_SEQPACKET` socket: one frame per message, a tag byte, then fixed little-endian
//! fields. Decoding checks every length and tag and returns `None` for anything malformed;
//! the receiving side drops the connection then.

use crate::error::{PostError, VerbsError};
use crate::types::{
    AccessFlags, AhAttr, Gid, MigState, Mtu, QpAttr, QpAttrMask, QpCap, QpState, Qpn, WcFlags,
    WcOpcode, WcStatus, WorkCompletion,
};
use crate::vocab::{AsyncEvent, SrqState};
use crate::wr::Sge;

/// Protocol version, checked in the first exchange.
pub(crate) const VERSION: u32 = 1;

/// Largest frame either side sends (a receive WQE with many SGEs is the largest).
pub(crate) const MAX_FRAME: usize = 4096;

/// Most SGEs one posted receive may carry over the socket.
pub(crate) const MAX_SGES: usize = 64;

/// Encoded size of one completion in a [`Push::Completions`] frame.
const COMPLETION_LEN: usize = 4 + 1 + 50;

/// Most completions in one frame.
pub(crate) const MAX_COMPLETIONS: usize = (MAX_FRAME - 3) / COMPLETION_LEN;

/// Most receives in one list.
pub(crate) const MAX_LIST: usize = 128;

/// The encoded size of a list of receives with these SGE counts (for splitting lists so
/// that every frame stays under [`MAX_FRAME`]).
pub(crate) fn list_frame_len(sge_counts: impl Iterator<Item = usize>) -> usize {
    7 + sge_counts.map(|k| 10 + 16 * k).sum::<usize>()
}

/// A member's request. Every request gets exactly one [`Reply`], in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    /// First frame: the member's protocol version.
    Hello {
        version: u32,
    },
    /// Mirror a registration of the member's memory under the member's own key.
    RegMr {
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    },
    /// Forget a mirrored registration (answered once the host no longer uses it).
    DeregMr {
        key: u32,
    },
    /// An XRC SRQ of the domain whose completions go to the member's CQ `cq`.
    CreateSrq {
        pd: u32,
        cq: u32,
        max_wr: u32,
        max_sge: u32,
    },
    DestroySrq {
        srq: u32,
    },
    /// Receives to post, in order, answered once: `Value(count)` when all were posted.
    PostSrqRecvList {
        srq: u32,
        wrs: Vec<(u64, Vec<Sge>)>,
    },
    ModifySrq {
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    },
    QuerySrq {
        srq: u32,
    },
    /// An XRC target QP of the domain.
    CreateTarget,
    /// Checks that target `qpn` exists in the domain (`ibv_open_qp`); its events are then
    /// forwarded to this member too.
    OpenTarget {
        qpn: Qpn,
    },
    ModifyQp {
        qpn: Qpn,
        attr: Box<QpAttr>,
        mask: QpAttrMask,
    },
    QueryQp {
        qpn: Qpn,
    },
    /// This member is done with target `qpn` (it is destroyed when nobody has it open).
    CloseTarget {
        qpn: Qpn,
    },
}

/// The host's answer to a request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// Success with a value (an SRQ or QP number, a flag; 0 when there is none).
    Value(u64),
    /// To `Hello`: the host's XRC domain handle and the UDP addresses of its ports, where
    /// the domain's target QPs receive.
    Welcome {
        xrcd: u32,
        ports: Vec<std::net::SocketAddr>,
    },
    Srq(SrqState),
    Qp(Box<(QpAttr, QpCap)>),
    /// The object does not exist (any more).
    Missing,
    /// A verbs error, by kind and text.
    Failed {
        kind: u8,
        text: String,
    },
    /// The receive at this index of a list could not be posted (those before it were).
    PostFailedAt(u32, PostError),
}

/// A forwarded completion: (the member's CQ, the completion, solicited).
pub(crate) type Forwarded = (u32, WorkCompletion, bool);

/// A frame the host sends unasked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Push {
    /// Completions for the member's CQs, in order: (CQ, completion, solicited). The host
    /// sends those of one flush together (one write, one wake-up of the member).
    Completions(Vec<Forwarded>),
    /// An asynchronous event about one of the member's SRQs or targets.
    Event(AsyncEvent),
}

/// Any frame, as read from the socket.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    Request(Request),
    Reply(Reply),
    Push(Push),
}

// Error kinds carried in `Reply::Failed`.
const E_ARG: u8 = 1;
const E_ATTR: u8 = 2;
const E_MISSING: u8 = 3;
const E_EXHAUSTED: u8 = 4;
const E_UNSUPPORTED: u8 = 5;

impl Reply {
    /// The reply for a verbs error.
    pub(crate) fn failed(e: &VerbsError) -> Self {
        let kind = match e {
            VerbsError::InvalidAttribute { .. }
            | VerbsError::IllegalTransition { .. }
            | VerbsError::MissingAttribute { .. }
            | VerbsError::UnexpectedAttribute { .. } => E_ATTR,
            VerbsError::NoSuchObject(_) => E_MISSING,
            VerbsError::ResourceExhausted(_) => E_EXHAUSTED,
            VerbsError::Unsupported(_) => E_UNSUPPORTED,
            _ => E_ARG,
        };
        Self::Failed {
            kind,
            text: e.to_string(),
        }
    }

    /// The verbs error a `Failed` reply stands for (the host's text, kind preserved where
    /// verbs has a kind without a fixed text).
    pub(crate) fn into_error(kind: u8, text: String) -> VerbsError {
        match kind {
            E_ATTR => VerbsError::InvalidAttribute {
                attr: "(checked by the XRC domain's host)",
                reason: text,
            },
            E_MISSING => VerbsError::NoSuchObject("object in the shared XRC domain"),
            E_EXHAUSTED => VerbsError::ResourceExhausted("shared XRC domain host resources"),
            E_UNSUPPORTED => VerbsError::Unsupported("operation in a shared XRC domain"),
            _ => VerbsError::InvalidArgument(format!("XRC domain host: {text}")),
        }
    }
}

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn opt(&mut self, v: Option<u32>) -> &mut Self {
        match v {
            Some(x) => self.u8(1).u32(x),
            None => self.u8(0).u32(0),
        }
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u16(b.len().min(usize::from(u16::MAX)) as u16);
        self.0
            .extend_from_slice(&b[..b.len().min(usize::from(u16::MAX))]);
        self
    }
    fn addr(&mut self, a: &std::net::SocketAddr) -> &mut Self {
        self.0.extend_from_slice(&Gid::from_ip(a.ip()).0);
        self.u16(a.port())
    }
    fn ah(&mut self, a: &AhAttr) -> &mut Self {
        self.0.extend_from_slice(&a.dgid.0);
        self.u8(a.sgid_index)
            .u8(a.port_num)
            .u8(a.hop_limit)
            .u8(a.traffic_class)
            .u32(a.flow_label)
            .u16(a.udp_port)
    }
    fn cap(&mut self, c: &QpCap) -> &mut Self {
        self.u32(c.max_send_wr)
            .u32(c.max_recv_wr)
            .u32(c.max_send_sge)
            .u32(c.max_recv_sge)
            .u32(c.max_inline_data)
    }
    fn attr(&mut self, a: &QpAttr) -> &mut Self {
        self.u8(a.qp_state as u8)
            .u8(a.cur_qp_state as u8)
            .u8(a.path_mtu as u8)
            .u8(a.path_mig_state as u8)
            .u32(a.qkey)
            .u32(a.rq_psn)
            .u32(a.sq_psn)
            .u32(a.dest_qp_num)
            .u32(a.qp_access_flags.bits())
            .cap(&a.cap)
            .ah(&a.ah_attr)
            .ah(&a.alt_ah_attr)
            .u16(a.pkey_index)
            .u16(a.alt_pkey_index)
            .u8(u8::from(a.en_sqd_async_notify))
            .u8(u8::from(a.sq_draining))
            .u8(a.max_rd_atomic)
            .u8(a.max_dest_rd_atomic)
            .u8(a.min_rnr_timer)
            .u8(a.port_num)
            .u8(a.timeout)
            .u8(a.retry_cnt)
            .u8(a.rnr_retry)
            .u8(a.alt_port_num)
            .u8(a.alt_timeout)
    }
    fn wc(&mut self, wc: &WorkCompletion) -> &mut Self {
        self.u64(wc.wr_id)
            .u32(wc.status.code())
            .u32(wc.opcode.code())
            .u32(wc.byte_len)
            .u32(wc.imm_data)
            .u32(wc.qp_num.0)
            .u32(wc.src_qp.0)
            .u32(wc.wc_flags.bits())
            .u32(wc.vendor_err)
            .u16(wc.slid)
    }
    fn post_error(&mut self, e: &PostError) -> &mut Self {
        let (tag, a, b) = match e {
            PostError::QueueFull { depth, .. } => (1, *depth, 0),
            PostError::TooManySge { count, max } => (2, *count as u32, *max),
            PostError::Destroyed => (3, 0, 0),
            _ => (4, 0, 0),
        };
        self.u8(tag).u32(a).u32(b)
    }
    fn event(&mut self, e: &AsyncEvent) -> &mut Self {
        let (tag, v) = match *e {
            AsyncEvent::CommEstablished(q) => (1, q.0),
            AsyncEvent::QpFatal(q) => (2, q.0),
            AsyncEvent::QpRequestError(q) => (3, q.0),
            AsyncEvent::QpAccessError(q) => (4, q.0),
            AsyncEvent::SqDrained(q) => (5, q.0),
            AsyncEvent::CqError(c) => (6, c),
            AsyncEvent::SrqLimitReached(s) => (7, s),
            AsyncEvent::QpLastWqeReached(q) => (8, q.0),
            AsyncEvent::PathMigrated(q) => (9, q.0),
            AsyncEvent::PathMigrationError(q) => (10, q.0),
            AsyncEvent::SrqError(s) => (11, s),
            AsyncEvent::DeviceFatal => (12, 0),
            // Port events are the host's own; nothing else is forwarded.
            _ => (0, 0),
        };
        self.u8(tag).u32(v)
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (a, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn opt(&mut self) -> Option<Option<u32>> {
        let some = self.bool()?;
        let v = self.u32()?;
        Some(some.then_some(v))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = usize::from(self.u16()?);
        if self.0.len() < n {
            return None;
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(a.to_vec())
    }
    fn addr(&mut self) -> Option<std::net::SocketAddr> {
        let gid = Gid(self.take::<16>()?);
        Some(std::net::SocketAddr::new(gid.to_ip(), self.u16()?))
    }
    fn state(&mut self) -> Option<QpState> {
        Some(match self.u8()? {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
    fn mtu(&mut self) -> Option<Mtu> {
        Some(match self.u8()? {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    fn mig(&mut self) -> Option<MigState> {
        Some(match self.u8()? {
            0 => MigState::Migrated,
            1 => MigState::Rearm,
            2 => MigState::Armed,
            _ => return None,
        })
    }
    fn ah(&mut self) -> Option<AhAttr> {
        Some(AhAttr {
            dgid: Gid(self.take::<16>()?),
            sgid_index: self.u8()?,
            port_num: self.u8()?,
            hop_limit: self.u8()?,
            traffic_class: self.u8()?,
            flow_label: self.u32()?,
            udp_port: self.u16()?,
        })
    }
    fn cap(&mut self) -> Option<QpCap> {
        Some(QpCap {
            max_send_wr: self.u32()?,
            max_recv_wr: self.u32()?,
            max_send_sge: self.u32()?,
            max_recv_sge: self.u32()?,
            max_inline_data: self.u32()?,
        })
    }
    fn attr(&mut self) -> Option<QpAttr> {
        Some(QpAttr {
            qp_state: self.state()?,
            cur_qp_state: self.state()?,
            path_mtu: self.mtu()?,
            path_mig_state: self.mig()?,
            qkey: self.u32()?,
            rq_psn: self.u32()?,
            sq_psn: self.u32()?,
            dest_qp_num: self.u32()?,
            qp_access_flags: AccessFlags(self.u32()?),
            cap: self.cap()?,
            ah_attr: self.ah()?,
            alt_ah_attr: self.ah()?,
            pkey_index: self.u16()?,
            alt_pkey_index: self.u16()?,
            en_sqd_async_notify: self.bool()?,
            sq_draining: self.bool()?,
            max_rd_atomic: self.u8()?,
            max_dest_rd_atomic: self.u8()?,
            min_rnr_timer: self.u8()?,
            port_num: self.u8()?,
            timeout: self.u8()?,
            retry_cnt: self.u8()?,
            rnr_retry: self.u8()?,
            alt_port_num: self.u8()?,
            alt_timeout: self.u8()?,
        })
    }
    fn wc(&mut self) -> Option<WorkCompletion> {
        Some(WorkCompletion {
            wr_id: self.u64()?,
            status: WcStatus::from_code(self.u32()?),
            opcode: WcOpcode::from_code(self.u32()?),
            byte_len: self.u32()?,
            imm_data: self.u32()?,
            qp_num: Qpn(self.u32()?),
            src_qp: Qpn(self.u32()?),
            wc_flags: WcFlags(self.u32()?),
            vendor_err: self.u32()?,
            slid: self.u16()?,
            // (XRC SRQs do no tag matching.)
            tm: crate::types::TmInfo::default(),
        })
    }
    fn event(&mut self) -> Option<AsyncEvent> {
        let tag = self.u8()?;
        let v = self.u32()?;
        Some(match tag {
            1 => AsyncEvent::CommEstablished(Qpn(v)),
            2 => AsyncEvent::QpFatal(Qpn(v)),
            3 => AsyncEvent::QpRequestError(Qpn(v)),
            4 => AsyncEvent::QpAccessError(Qpn(v)),
            5 => AsyncEvent::SqDrained(Qpn(v)),
            6 => AsyncEvent::CqError(v),
            7 => AsyncEvent::SrqLimitReached(v),
            8 => AsyncEvent::QpLastWqeReached(Qpn(v)),
            9 => AsyncEvent::PathMigrated(Qpn(v)),
            10 => AsyncEvent::PathMigrationError(Qpn(v)),
            11 => AsyncEvent::SrqError(v),
            12 => AsyncEvent::DeviceFatal,
            _ => return None,
        })
    }
    fn post_error(&mut self) -> Option<PostError> {
        let tag = self.u8()?;
        let a = self.u32()?;
        let b = self.u32()?;
        Some(match tag {
            1 => PostError::QueueFull {
                what: "shared receive",
                depth: a,
            },
            2 => PostError::TooManySge {
                count: a as usize,
                max: b,
            },
            3 => PostError::Destroyed,
            _ => PostError::InvalidWorkRequest("refused by the XRC domain's host"),
        })
    }
}

/// Event tags the protocol carries (anything else is not forwarded).
pub(crate) fn forwardable(e: &AsyncEvent) -> bool {
    let mut w = W(Vec::new());
    w.event(e);
    w.0[0] != 0
}

impl Frame {
    /// The frame's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64));
        match self {
            Self::Request(r) => match r {
                Request::Hello { version } => {
                    w.u8(1).u32(*version);
                }
                Request::RegMr {
                    key,
                    pd,
                    addr,
                    len,
                    access,
                } => {
                    w.u8(2)
                        .u32(*key)
                        .u32(*pd)
                        .u64(*addr)
                        .u64(*len)
                        .u32(access.bits());
                }
                Request::DeregMr { key } => {
                    w.u8(3).u32(*key);
                }
                Request::CreateSrq {
                    pd,
                    cq,
                    max_wr,
                    max_sge,
                } => {
                    w.u8(4).u32(*pd).u32(*cq).u32(*max_wr).u32(*max_sge);
                }
                Request::DestroySrq { srq } => {
                    w.u8(5).u32(*srq);
                }
                Request::PostSrqRecvList { srq, wrs } => {
                    w.u8(14).u32(*srq).u16(wrs.len() as u16);
                    for (wr_id, sges) in wrs {
                        w.u64(*wr_id).u16(sges.len() as u16);
                        for s in sges {
                            w.u64(s.addr).u32(s.length).u32(s.lkey.0);
                        }
                    }
                }
                Request::ModifySrq { srq, max_wr, limit } => {
                    w.u8(7).u32(*srq).opt(*max_wr).opt(*limit);
                }
                Request::QuerySrq { srq } => {
                    w.u8(8).u32(*srq);
                }
                Request::CreateTarget => {
                    w.u8(9);
                }
                Request::OpenTarget { qpn } => {
                    w.u8(10).u32(qpn.0);
                }
                Request::ModifyQp { qpn, attr, mask } => {
                    w.u8(11).u32(qpn.0).u32(mask.bits()).attr(attr);
                }
                Request::QueryQp { qpn } => {
                    w.u8(12).u32(qpn.0);
                }
                Request::CloseTarget { qpn } => {
                    w.u8(13).u32(qpn.0);
                }
            },
            Self::Reply(r) => match r {
                Reply::Value(v) => {
                    w.u8(0x41).u64(*v);
                }
                Reply::Welcome { xrcd, ports } => {
                    w.u8(0x42).u32(*xrcd).u8(ports.len().min(8) as u8);
                    for p in ports.iter().take(8) {
                        w.addr(p);
                    }
                }
                Reply::Srq(s) => {
                    w.u8(0x43)
                        .u32(s.max_wr)
                        .u32(s.max_sge)
                        .u32(s.srq_limit)
                        .opt(s.posted);
                }
                Reply::Qp(b) => {
                    w.u8(0x44).attr(&b.0).cap(&b.1);
                }
                Reply::Missing => {
                    w.u8(0x45);
                }
                Reply::Failed { kind, text } => {
                    w.u8(0x46).u8(*kind).bytes(text.as_bytes());
                }
                Reply::PostFailedAt(i, e) => {
                    w.u8(0x48).u32(*i).post_error(e);
                }
            },
            Self::Push(p) => match p {
                Push::Completions(list) => {
                    w.u8(0x81).u16(list.len() as u16);
                    for (cq, wc, solicited) in list {
                        w.u32(*cq).u8(u8::from(*solicited)).wc(wc);
                    }
                }
                Push::Event(e) => {
                    w.u8(0x82).event(e);
                }
            },
        }
        w.0
    }

    /// Parses one frame; `None` for anything malformed or with bytes left over.
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let mut r = R(b);
        let f = match r.u8()? {
            1 => Self::Request(Request::Hello { version: r.u32()? }),
            2 => Self::Request(Request::RegMr {
                key: r.u32()?,
                pd: r.u32()?,
                addr: r.u64()?,
                len: r.u64()?,
                access: AccessFlags(r.u32()?),
            }),
            3 => Self::Request(Request::DeregMr { key: r.u32()? }),
            4 => Self::Request(Request::CreateSrq {
                pd: r.u32()?,
                cq: r.u32()?,
                max_wr: r.u32()?,
                max_sge: r.u32()?,
            }),
            5 => Self::Request(Request::DestroySrq { srq: r.u32()? }),
            14 => {
                let srq = r.u32()?;
                let n = usize::from(r.u16()?);
                if n > MAX_LIST {
                    return None;
                }
                let mut wrs = Vec::with_capacity(n);
                for _ in 0..n {
                    let wr_id = r.u64()?;
                    let k = usize::from(r.u16()?);
                    if k > MAX_SGES {
                        return None;
                    }
                    let mut sges = Vec::with_capacity(k);
                    for _ in 0..k {
                        sges.push(Sge {
                            addr: r.u64()?,
                            length: r.u32()?,
                            lkey: crate::types::Lkey(r.u32()?),
                        });
                    }
                    wrs.push((wr_id, sges));
                }
                Self::Request(Request::PostSrqRecvList { srq, wrs })
            }
            7 => Self::Request(Request::ModifySrq {
                srq: r.u32()?,
                max_wr: r.opt()?,
                limit: r.opt()?,
            }),
            8 => Self::Request(Request::QuerySrq { srq: r.u32()? }),
            9 => Self::Request(Request::CreateTarget),
            10 => Self::Request(Request::OpenTarget { qpn: Qpn(r.u32()?) }),
            11 => Self::Request(Request::ModifyQp {
                qpn: Qpn(r.u32()?),
                mask: QpAttrMask(r.u32()?),
                attr: Box::new(r.attr()?),
            }),
            12 => Self::Request(Request::QueryQp { qpn: Qpn(r.u32()?) }),
            13 => Self::Request(Request::CloseTarget { qpn: Qpn(r.u32()?) }),
            0x41 => Self::Reply(Reply::Value(r.u64()?)),
            0x42 => {
                let xrcd = r.u32()?;
                let n = r.u8()?;
                let mut ports = Vec::new();
                for _ in 0..n.min(8) {
                    ports.push(r.addr()?);
                }
                Self::Reply(Reply::Welcome { xrcd, ports })
            }
            0x43 => Self::Reply(Reply::Srq(SrqState {
                max_wr: r.u32()?,
                max_sge: r.u32()?,
                srq_limit: r.u32()?,
                posted: r.opt()?,
            })),
            0x44 => Self::Reply(Reply::Qp(Box::new((r.attr()?, r.cap()?)))),
            0x45 => Self::Reply(Reply::Missing),
            0x46 => {
                let kind = r.u8()?;
                let text = String::from_utf8_lossy(&r.bytes()?).into_owned();
                Self::Reply(Reply::Failed { kind, text })
            }
            0x48 => {
                let i = r.u32()?;
                Self::Reply(Reply::PostFailedAt(i, r.post_error()?))
            }
            0x81 => {
                let n = usize::from(r.u16()?);
                if n > MAX_COMPLETIONS {
                    return None;
                }
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    let cq = r.u32()?;
                    let solicited = r.bool()?;
                    list.push((cq, r.wc()?, solicited));
                }
                Self::Push(Push::Completions(list))
            }
            0x82 => Self::Push(Push::Event(r.event()?)),
            _ => return None,
        };
        r.0.is_empty().then_some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame> {
        let mut attr = QpAttr {
            qp_state: QpState::Rtr,
            dest_qp_num: 0xABCDEF,
            rq_psn: 77,
            max_dest_rd_atomic: 4,
            ..QpAttr::default()
        };
        attr.ah_attr.udp_port = 40000;
        attr.alt_ah_attr.port_num = 2;
        let wc = WorkCompletion {
            wr_id: u64::MAX - 3,
            byte_len: 4096,
            qp_num: Qpn(0x123456),
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::Recv,
            ..WorkCompletion::EMPTY
        };
        vec![
            Frame::Request(Request::Hello { version: VERSION }),
            Frame::Request(Request::RegMr {
                key: 9,
                pd: 2,
                addr: 0x7fff_0000,
                len: 1 << 20,
                access: AccessFlags::LOCAL_WRITE,
            }),
            Frame::Request(Request::PostSrqRecvList {
                srq: 5,
                wrs: vec![
                    (1, vec![]),
                    (
                        2,
                        vec![Sge {
                            addr: 9,
                            length: 8,
                            lkey: crate::types::Lkey(7),
                        }],
                    ),
                ],
            }),
            Frame::Reply(Reply::PostFailedAt(3, PostError::Destroyed)),
            Frame::Request(Request::ModifySrq {
                srq: 1,
                max_wr: None,
                limit: Some(8),
            }),
            Frame::Request(Request::ModifyQp {
                qpn: Qpn(42),
                attr: Box::new(attr),
                mask: QpAttrMask::STATE,
            }),
            Frame::Reply(Reply::Welcome {
                xrcd: 3,
                ports: vec!["127.0.0.1:4000".parse().unwrap()],
            }),
            Frame::Reply(Reply::Qp(Box::new((attr, QpCap::default())))),
            Frame::Reply(Reply::Failed {
                kind: E_ATTR,
                text: "bad".into(),
            }),
            Frame::Push(Push::Completions(vec![
                (4, wc, true),
                (5, WorkCompletion::EMPTY, false),
            ])),
            Frame::Push(Push::Event(AsyncEvent::SrqLimitReached(7))),
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in frames() {
            assert_eq!(Frame::decode(&f.encode()), Some(f.clone()), "{f:?}");
        }
    }

    #[test]
    fn the_largest_frames_fit() {
        let full = Frame::Push(Push::Completions(vec![
            (
                u32::MAX,
                WorkCompletion::EMPTY,
                true
            );
            MAX_COMPLETIONS
        ]));
        assert!(full.encode().len() <= MAX_FRAME);
        let sge = Sge {
            addr: 1,
            length: 1,
            lkey: crate::types::Lkey(1),
        };
        let wrs = vec![(0u64, vec![sge; 1]); MAX_LIST];
        let n = Frame::Request(Request::PostSrqRecvList { srq: 1, wrs })
            .encode()
            .len();
        assert_eq!(n, list_frame_len(std::iter::repeat_n(1, MAX_LIST)));
        let over = Frame::Push(Push::Completions(vec![
            (1, WorkCompletion::EMPTY, false);
            MAX_COMPLETIONS + 1
        ]));
        assert_eq!(Frame::decode(&over.encode()), None, "too many completions");
    }

    #[test]
    fn truncated_extended_or_garbage_frames_are_refused() {
        for f in frames() {
            let b = f.encode();
            for n in 0..b.len() {
                assert_eq!(Frame::decode(&b[..n]), None, "{f:?} cut at {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Frame::decode(&longer), None);
        }
        for tag in [0u8, 6, 15, 0x40, 0x47, 0x49, 0x80, 0x83, 0xFF] {
            assert_eq!(Frame::decode(&[tag, 0, 0, 0, 0]), None);
        }
    }
}
