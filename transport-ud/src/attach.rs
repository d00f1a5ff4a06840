//! [`UdTransport`]: the UD transport of a worker — one datagram queue pair for every peer,
//! its receive buffers, and the sessions — and how endpoints are made.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rdmx_core::bootstrap::{self, DatagramKey};
use rdmx_core::worker::Worker;
use rdmx_core::{Config, Error, Result};
use rdmx_verbs::ah::GRH_LEN;
use rdmx_verbs::{QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState};

use crate::endpoint::Endpoint;
use crate::session::SessionConfig;
use crate::setup::peer_half;
use crate::state::{Shared, State, Ud, UdRef, UdStats};

/// The Q_Key of rdmx UD datagrams (a datagram with another is dropped by the NIC).
pub const QKEY: u32 = 0x7264_6d78;

/// The UD transport of a worker (see the crate docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct UdTransport {
    pub(crate) u: UdRef,
}

impl UdTransport {
    /// Adds the UD transport to `worker`: a completion queue on its channel, one UD queue
    /// pair with `cfg.srq_depth` receive buffers from the worker's pool (its pool needs the
    /// class [`RECV_BUF_SIZE`](Self::RECV_BUF_SIZE)) shared by every session, sessions whose
    /// receive window is up to `cfg.credits` datagrams. Of the buffers, `max(64, srq_depth /
    /// 8)` (at most half) are kept for control datagrams; the sessions' windows share the
    /// rest, so any number of peers can connect: idle ones hold no buffer.
    ///
    /// # Errors
    /// `Verbs` when a resource cannot be created; `Config` when the receive queue is too
    /// short for one window beside the control reserve, or credits are 0.
    pub fn attach(w: &Worker, cfg: &Config) -> Result<Self> {
        let (control, data) = crate::budget::split(cfg.srq_depth);
        if cfg.credits == 0 || cfg.credits > data {
            return Err(Error::Config(format!(
                "credits = {} with srq_depth = {}: a UD receive queue keeps {control} buffers \
                 for control datagrams, and its other {data} must back at least one window",
                cfg.credits, cfg.srq_depth
            )));
        }
        let mut made = None;
        w.add_transport(|tid, post_key| {
            let vctx = w.verbs_context().clone();
            let pd = w.pd(post_key).clone();
            let pool = w.pool().clone();
            let dev = vctx.query_device();
            let port = vctx.query_port(1)?;
            let max_datagram = port.active_mtu.bytes().min(Self::RECV_BUF_SIZE - GRH_LEN);
            let rq_depth = cfg.srq_depth;
            let ctrl_depth = ctrl_depth(cfg.srq_depth).min(dev.max_qp_wr.max(1));
            let sq_depth = (cfg.credits.saturating_mul(4)).clamp(64, 4096);
            let cqe = ((rq_depth + ctrl_depth + 2 * sq_depth) as usize * 2)
                .min(dev.max_cqe.max(1) as usize);
            let cq = vctx.create_cq(cqe, Some(w.channel()))?;
            let qp = ud_qp(&pd, &cq, sq_depth, rq_depth)?;
            let ctrl_qp = ud_qp(&pd, &cq, sq_depth, ctrl_depth)?;
            let addr = vctx.port_addr(1)?;
            let gid_index = match cfg.gid_index {
                Some(i) => i,
                None => vctx.roce_v2_gid_index(1)?,
            };
            let session = SessionConfig {
                max_datagram,
                max_message: cfg.max_message,
                recv_window: cfg.credits,
                send_window: cfg.credits,
                peer_timeout: cfg.peer_timeout,
                ..SessionConfig::default()
            };
            let recv_len = GRH_LEN + max_datagram;
            pool.reserve(pool.footprint_of(rq_depth as usize, recv_len));
            pool.reserve(pool.footprint_of(ctrl_depth as usize, CTRL_BUF_SIZE));
            let sh = Arc::new(Shared {
                tid,
                post_key,
                vctx,
                pd,
                cq,
                qp,
                ctrl_qp,
                pool,
                qkey: QKEY,
                gid_index,
                session,
                keyed: cfg.auth_key.is_some(),
                sq_depth,
                addr,
                cfg: cfg.clone(),
                accept_data: parking_lot::Mutex::new(Vec::new()),
            });
            let mut st = State::new(max_datagram, data);
            for _ in 0..rq_depth {
                let buf = sh.pool.try_alloc(recv_len)?;
                sh.post_recv(&mut st, buf, false)?;
            }
            for _ in 0..ctrl_depth {
                let buf = sh.pool.try_alloc(CTRL_BUF_SIZE)?;
                sh.post_recv(&mut st, buf, true)?;
            }
            made = Some(sh.clone());
            Ok(Ud { sh, st })
        })?;
        let sh = made.ok_or_else(|| Error::Config("the UD transport was not made".into()))?;
        Ok(Self {
            u: UdRef { w: w.clone(), sh },
        })
    }

    /// The pool class a worker needs for this transport's receive buffers: the GRH and a
    /// datagram of the largest path MTU (open the worker with it, `Worker::open(cfg, _,
    /// &[RECV_BUF_SIZE])`).
    pub const RECV_BUF_SIZE: usize = GRH_LEN + 4096;

    /// This transport's address (its device's first port).
    pub fn addr(&self) -> SocketAddr {
        self.u.sh.addr
    }

    /// The number of the queue pair every peer sends to.
    pub fn qp_num(&self) -> rdmx_verbs::Qpn {
        self.u.sh.qp.qp_num()
    }

    /// Counters: the transport's, and the sum of its sessions' (open and ended).
    pub fn stats(&self) -> UdStats {
        self.u.with(|_, st, _| {
            let mut s = UdStats {
                grants: st.budget.grants,
                recalls: st.budget.recalls,
                credit_waits: st.budget.waits,
                retransmits: st.ended.retransmits,
                duplicates: st.ended.duplicates,
                out_of_order: st.ended.out_of_order,
                refused: st.ended.refused,
                ..st.stats
            };
            for p in st.peers.iter().filter_map(|(_, p)| p.as_ref()) {
                let x = p.session.stats();
                s.retransmits += x.retransmits;
                s.duplicates += x.duplicates;
                s.out_of_order += x.out_of_order;
                s.refused += x.refused;
                s.held_datagrams += u64::from(p.session.held_packets());
            }
            s
        })
    }

    /// Sessions (endpoints, including closing ones whose handle is gone).
    pub fn endpoint_count(&self) -> usize {
        self.u
            .with(|_, st, _| st.peers.iter().filter(|(_, p)| p.is_some()).count())
    }

    /// Connects an endpoint to a UD listener at `addr` (the bootstrap side channel).
    ///
    /// # Errors
    /// `Bootstrap` when the exchange fails (refused, garbage, version mismatch, timeout);
    /// `Protocol` when the listener is not a UD one; `Config` when the transport holds
    /// 65,536 sessions already.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        self.connect_with(addr, &[])
    }

    /// [`connect`](Self::connect), sending `data` with the connection (at most 4 KiB; the
    /// accepted endpoint shows it as its [`Endpoint::peer_data`]).
    ///
    /// # Errors
    /// As `connect`; `InvalidArgument` for more than 4 KiB.
    pub fn connect_with(&self, addr: impl ToSocketAddrs, data: &[u8]) -> Result<Endpoint> {
        bootstrap::check_app_data(data)?;
        crate::exchange::connect(&self.u, resolve(addr)?, data)
    }

    /// Starts accepting UD endpoints on `addr`.
    ///
    /// # Errors
    /// `Bootstrap` when the address cannot be bound.
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        let tcp = bootstrap::listen(resolve(addr)?)?;
        let local = tcp
            .local_addr()
            .map_err(|error| bootstrap::BootstrapError::Io {
                op: "local_addr",
                error,
            })?;
        Ok(Listener {
            t: self.clone(),
            tcp,
            local,
            exchanges: Arc::new(crate::exchange::Exchanges::new(
                self.u.sh.cfg.connect_timeout,
            )),
        })
    }

    /// Connects an endpoint of this transport to a new endpoint of `peer` (another UD
    /// transport in this process) with no side channel: each side's session is set up
    /// with what the other would have sent. Returns (ours, the peer's).
    ///
    /// # Errors
    /// `Config` when either receive queue cannot back another peer's window;
    /// `InvalidArgument` for a transport connecting to itself.
    pub fn connect_local(&self, peer: &Self) -> Result<(Endpoint, Endpoint)> {
        if Arc::ptr_eq(&self.u.sh, &peer.u.sh) {
            return Err(Error::InvalidArgument(
                "a UD transport cannot connect an endpoint to itself in-process".into(),
            ));
        }
        let a = self.u.reserve()?;
        let b = match peer.u.reserve() {
            Ok(b) => b,
            Err(e) => {
                self.u.unreserve(&a);
                return Err(e);
            }
        };
        let r = (|| {
            // With a key (the same on both: there is no exchange to check it), a datagram
            // key of this pair's own.
            let mac = match (&self.u.sh.cfg.auth_key, &peer.u.sh.cfg.auth_key) {
                (None, None) => None,
                (Some(k), Some(l)) if k == l => {
                    let nonce = rdmx_verbs::random_u64().to_be_bytes();
                    Some(k.datagram_key(b"in-process connection", &nonce))
                }
                _ => {
                    return Err(Error::InvalidArgument(
                        "in-process UD endpoints need the same authentication key on both \
                         transports, or none"
                            .into(),
                    ));
                }
            };
            let a_half = peer_half(&self.u.describe(&a, Vec::new())?)?;
            let b_half = peer_half(&peer.u.describe(&b, Vec::new())?)?;
            let ea = self.u.open(a, &b_half, mac.clone())?;
            let eb = peer.u.open(b, &a_half, mac)?;
            Ok((ea, eb))
        })();
        if r.is_err() {
            self.u.unreserve(&a);
            peer.u.unreserve(&b);
        }
        r
    }
}

/// Accepts UD endpoints on a TCP address (the bootstrap side channel).
#[derive(Debug)]
pub struct Listener {
    t: UdTransport,
    tcp: TcpListener,
    local: SocketAddr,
    exchanges: Arc<crate::exchange::Exchanges>,
}

impl Listener {
    /// Sets the connection data this transport's listeners answer with from now on (at
    /// most 4 KiB): connecting endpoints see it as their [`Endpoint::peer_data`].
    ///
    /// # Errors
    /// `InvalidArgument` for more than 4 KiB.
    pub fn set_accept_data(&self, data: &[u8]) -> Result<()> {
        bootstrap::check_app_data(data)?;
        *self.t.u.sh.accept_data.lock() = data.to_vec();
        Ok(())
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next endpoint (exchanges run concurrently; those that fail are logged and
    /// skipped).
    ///
    /// # Errors
    /// `Bootstrap` when the listening socket fails.
    pub fn accept(&self) -> Result<Endpoint> {
        crate::exchange::accept(&self.t.u, &self.tcp, &self.exchanges, None)
    }

    /// [`accept`](Self::accept), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `accept`; `Timeout`.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Endpoint> {
        crate::exchange::accept(&self.t.u, &self.tcp, &self.exchanges, Some(timeout))
    }

    /// The transport it accepts for.
    pub fn transport(&self) -> &UdTransport {
        &self.t
    }
}

/// The first address `addr` resolves to.
fn resolve(addr: impl ToSocketAddrs) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("bad address: {e}")))?
        .next()
        .ok_or_else(|| Error::InvalidArgument("the address resolved to nothing".into()))
}

/// The receive buffers of the control queue pair: a GRH and a header.
const CTRL_BUF_SIZE: usize = GRH_LEN + crate::wire::HEADER_LEN + DatagramKey::TAG_LEN;

/// How many control datagrams the control queue pair can hold: eight for every data
/// buffer, at least 1,024 and at most 32,768 (each takes a 128-byte pool slot: 4 MiB at
/// most). Acknowledgements, credit requests, recalls and keepalives go there, so that a
/// burst of them from thousands of peers takes none of the buffers the data budget promised
/// (see `budget`).
fn ctrl_depth(srq_depth: u32) -> u32 {
    srq_depth.saturating_mul(8).clamp(1024, 32 * 1024)
}

/// A UD queue pair on `cq` (sends and receives) with room for `sq` sends and `rq` receives
/// of one scatter-gather entry each, brought up to RTS with rdmx's Q_Key.
pub(crate) fn ud_qp(
    pd: &rdmx_verbs::ProtectionDomain,
    cq: &rdmx_verbs::CompletionQueue,
    sq: u32,
    rq: u32,
) -> Result<rdmx_verbs::QueuePair> {
    let mut attr = QpInitAttr::ud(cq, cq);
    attr.cap = QpCap {
        max_send_wr: sq,
        max_recv_wr: rq,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&attr)?;
    bring_up(&qp)?;
    Ok(qp)
}

/// RESET -> INIT -> RTR -> RTS for a UD queue pair with the rdmx Q_Key.
pub(crate) fn bring_up(qp: &rdmx_verbs::QueuePair) -> Result<()> {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..QpAttr::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        },
        M::STATE,
    )?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            sq_psn: (rdmx_verbs::random_u64() as u32) & 0x00ff_ffff,
            ..QpAttr::default()
        },
        M::STATE | M::SQ_PSN,
    )?;
    Ok(())
}
