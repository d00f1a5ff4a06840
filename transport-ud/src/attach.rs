//! [`UdTransport`]: the UD transport of a worker — one datagram queue pair for every peer,
//! its receive buffers, and the sessions — and how endpoints are made.

use std::sync::Arc;

use rdmx_core::worker::{WaitSlot, Worker};
use rdmx_core::{Config, Error, Result};
use rdmx_verbs::ah::GRH_LEN;
use rdmx_verbs::{AhAttr, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState};

use crate::endpoint::Endpoint;
use crate::seq::Seq;
use crate::session::{Session, SessionConfig};
use crate::state::{Peer, Shared, State, Ud, UdRef, UdStats};

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
    /// class [`RECV_BUF_SIZE`](Self::RECV_BUF_SIZE)), sessions whose receive window is
    /// `cfg.credits` datagrams.
    ///
    /// # Errors
    /// `Verbs` when a resource cannot be created; `Config` when the receive queue cannot
    /// back one peer's window.
    pub fn attach(w: &Worker, cfg: &Config) -> Result<Self> {
        if cfg.credits > cfg.srq_depth {
            return Err(Error::Config(format!(
                "credits = {} exceed srq_depth = {}: the receive queue must back at least one \
                 peer's window",
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
            let sq_depth = (cfg.credits.saturating_mul(4)).clamp(64, 4096);
            let cqe = ((rq_depth + sq_depth) as usize * 2).min(dev.max_cqe.max(1) as usize);
            let cq = vctx.create_cq(cqe, Some(w.channel()))?;
            let mut attr = QpInitAttr::ud(&cq, &cq);
            attr.cap = QpCap {
                max_send_wr: sq_depth,
                max_recv_wr: rq_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            let qp = pd.create_qp(&attr)?;
            bring_up(&qp)?;
            let addr = vctx.port_addr(1)?;
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
            let sh = Arc::new(Shared {
                tid,
                post_key,
                vctx,
                pd,
                cq,
                qp,
                pool,
                qkey: QKEY,
                session,
                rq_depth,
                sq_depth,
                addr,
                cfg: cfg.clone(),
            });
            let mut st = State::new(max_datagram);
            for _ in 0..rq_depth {
                let buf = sh.pool.try_alloc(recv_len)?;
                sh.post_recv(&mut st, buf)?;
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
    pub fn addr(&self) -> std::net::SocketAddr {
        self.u.sh.addr
    }

    /// Counters.
    pub fn stats(&self) -> UdStats {
        self.u.with(|_, st, _| st.stats)
    }

    /// Sessions (endpoints, including closing ones whose handle is gone).
    pub fn endpoint_count(&self) -> usize {
        self.u.with(|_, st, _| st.peers.len())
    }

    /// Connects an endpoint of this transport to a new endpoint of `peer` (another UD
    /// transport in this process) with no side channel: each side's session is set up
    /// with the other's address, queue pair, id, token and first sequence number. Returns
    /// (ours, the peer's).
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
        let a_first = Seq(rdmx_verbs::random_u64() as u32);
        let b_first = Seq(rdmx_verbs::random_u64() as u32);
        let a_token = rdmx_verbs::random_u64() as u32;
        let b_token = rdmx_verbs::random_u64() as u32;
        let a_key = self.reserve()?;
        let b_key = match peer.reserve() {
            Ok(k) => k,
            Err(e) => {
                self.unreserve();
                return Err(e);
            }
        };
        let a = self.open(a_key, a_token, (b_key, b_token), (a_first, b_first), peer);
        let b = peer.open(b_key, b_token, (a_key, a_token), (b_first, a_first), self);
        match (a, b) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    /// Takes a receive window from the budget; returns the session key.
    fn reserve(&self) -> Result<usize> {
        self.u.with(|sh, st, _| {
            let w = u64::from(sh.session.recv_window);
            if st.windows + w > u64::from(sh.rq_depth) {
                return Err(Error::Config(format!(
                    "the receive queue ({} buffers) backs at most {} peers at {} credits each",
                    sh.rq_depth,
                    u64::from(sh.rq_depth) / w,
                    w
                )));
            }
            st.windows += w;
            Ok(st.peers.vacant_key())
        })
    }

    /// Gives back a window [`reserve`](Self::reserve) took for a session never opened.
    fn unreserve(&self) {
        self.u.with(|sh, st, _| {
            st.windows = st.windows.saturating_sub(u64::from(sh.session.recv_window));
        });
    }

    /// Opens session `key` towards `peer`'s session.
    fn open(
        &self,
        key: usize,
        token: u32,
        (peer_key, peer_token): (usize, u32),
        (first, peer_first): (Seq, Seq),
        peer: &Self,
    ) -> Result<Endpoint> {
        let peer_addr = peer.u.sh.addr;
        let remote_qpn = peer.u.sh.qp.qp_num();
        let gid = peer.u.sh.vctx.query_gid(1, 0)?;
        let ah = self
            .u
            .sh
            .pd
            .create_ah(&AhAttr::new(gid).with_udp_port(peer_addr.port()))?;
        let id = self.u.with(|sh, st, cx| {
            let id = st.next_id;
            st.next_id += 1;
            let session = Session::new(
                sh.session.clone(),
                token,
                peer_key as u32,
                peer_token,
                first,
                peer_first,
                cx.now(),
            );
            let k = st.peers.insert(Peer {
                id,
                session,
                ah,
                remote_qpn,
                wait: WaitSlot::new(key),
                detached: false,
                timer_at: None,
                told_down: false,
            });
            debug_assert_eq!(k, key);
            st.mark_dirty(k);
            let now = cx.now();
            sh.after(st, cx, now);
            id
        });
        Ok(Endpoint {
            u: self.u.clone(),
            key,
            id,
            peer: peer_addr,
        })
    }
}

/// RESET -> INIT -> RTR -> RTS for a UD queue pair with the rdmx Q_Key.
fn bring_up(qp: &rdmx_verbs::QueuePair) -> Result<()> {
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
