//! The RC/XRC transport of a worker as applications and contexts see it: [`RcTransport`]
//! makes endpoints (`connect`, [`Listener`]) and one-sided regions, and reports its counters.
//! A context (`rdmx_rc::Context`, or the `rdmx` facade's) composes a worker with it.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdmx_core::bootstrap;
use rdmx_core::header::{HEADER_LEN, RTS_LEN};
use rdmx_core::worker::{Worker, WorkerHandle};
use rdmx_core::{Config, Error, RegCacheStats, Result};
use rdmx_verbs::{AccessFlags, SrqInitAttr};

use crate::endpoint::{Endpoint, LocalRegion, RemoteAccess};
use crate::node::Node;
use crate::state::{MAX_ENDPOINTS, Rc, RcRef, Shared, State, Stats};
use crate::util::{far, random_u64, resolve};
use crate::wire::MAILBOX_LEN;

/// The RC/XRC transport of a worker: one completion queue and shared receive queue for all
/// its endpoints, the mailbox region peers write credits into, and the endpoint table.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct RcTransport {
    pub(crate) rc: RcRef,
}

impl RcTransport {
    /// Adds the RC transport (XRC when `node` is given) to `worker`, configured by `cfg`.
    /// The worker must run on the node's device and protection domain for XRC
    /// ([`Worker::over`]), and its pool must have the receive-buffer class
    /// (`cfg.recv_buf_size()`).
    ///
    /// # Errors
    /// `Verbs` when a resource cannot be created.
    pub fn attach(w: &Worker, cfg: &Config, node: Option<&Node>) -> Result<Self> {
        let mut cfg = cfg.clone();
        let mut made = None;
        w.add_transport(|tid, post_key| {
            let pd = w.pd(post_key).clone();
            let vctx = w.verbs_context().clone();
            let pool = w.pool().clone();
            let dev = vctx.query_device();
            let cqe = (cfg.srq_depth as usize * 2 + 64 * 1024).min(dev.max_cqe.max(1) as usize);
            let cq = vctx.create_cq(cqe, Some(w.channel()))?;
            let srq_attr = SrqInitAttr {
                max_wr: cfg.srq_depth,
                max_sge: 1,
                srq_limit: (cfg.srq_depth / 4).max(1),
            };
            let srq = match &node {
                Some(n) => pd.create_xrc_srq(&n.inner.xrcd, &cq, &srq_attr)?,
                None => pd.create_srq(&srq_attr)?,
            };
            // No peer writes the region itself: with windows, each writes its own slot
            // through a window bound to its endpoint's queue pair; without (and on XRC), each
            // slot is a registration of its own (`ep::Slot`, see `setup.rs`), and the region
            // is not used.
            let confine = node.is_none() && dev.memory_windows;
            let mailbox = if confine {
                pd.reg_mr(
                    MAX_ENDPOINTS * MAILBOX_LEN,
                    AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
                )?
            } else {
                pd.reg_mr(MAILBOX_LEN, AccessFlags::LOCAL_WRITE)?
            };
            let max_inline_data = ((cfg.inline_threshold + HEADER_LEN).max(RTS_LEN) as u32)
                .min(dev.max_inline_data.max(RTS_LEN as u32));
            let inline_max = cfg
                .inline_threshold
                .min((max_inline_data as usize).saturating_sub(HEADER_LEN));
            // What `config()` reports is what applies: the inline threshold as the device caps
            // it, and the largest message as the pool can hold one beside the receive buffers
            // (which stay posted for the context's life). A bigger message could never be
            // received: its rendezvous read would wait for a buffer for ever.
            cfg.inline_threshold = inline_max;
            pool.reserve(pool.footprint_of(cfg.srq_depth as usize, cfg.recv_buf_size()));
            let largest = pool.largest();
            if cfg.max_message > largest {
                tracing::info!(
                    max_message = cfg.max_message,
                    largest,
                    pool_max = cfg.pool_max,
                    "max_message lowered to the largest buffer the pool can hold beside the \
                     receive buffers"
                );
                cfg.max_message = largest;
            }
            let port = vctx.query_port(1)?;
            let gid_of = |p: u8| -> Result<u32> {
                Ok(match cfg.gid_index {
                    Some(i) => i,
                    None => vctx.roce_v2_gid_index(p)?,
                })
            };
            let gid_index = [
                gid_of(1)?,
                if dev.phys_port_cnt >= 2 {
                    gid_of(2)?
                } else {
                    0
                },
            ];
            tracing::debug!(?gid_index, "GID indexes of ports 1 and 2");
            let regcache = rdmx_core::RegCache::new(pd.clone(), cfg.regcache_max);
            let batch_posts = node.as_ref().is_some_and(|n| n.inner.xrcd.is_remote());
            let st = State::new(&cfg, w.now());
            let shared = Arc::new(Shared {
                vctx,
                pd,
                cq,
                srq,
                mailbox,
                pool,
                regcache,
                tid,
                inline_max,
                max_inline_data,
                mtu_bytes: port.active_mtu.bytes() as u32,
                ports: dev.phys_port_cnt,
                node: node.map(|n| Arc::clone(&n.inner)),
                node_events: Arc::new(Mutex::new(std::collections::VecDeque::new())),
                xrc_lock: Mutex::new(()),
                accept_data: Mutex::new(Vec::new()),
                batch_posts,
                context_id: random_u64(),
                post_key,
                // XRC: a window cannot be bound to a target queue pair (it has no send
                // queue), and type 1 windows answer any queue pair of the domain.
                confine,
                confine_xrc: dev.memory_windows
                    && node.as_ref().is_some_and(|n| !n.inner.xrcd.is_remote()),
                gid_index,
                cfg,
            });
            made = Some(shared.clone());
            Ok(Rc { sh: shared, st })
        })?;
        let shared = made.ok_or_else(|| Error::Config("the RC transport was not made".into()))?;
        let rc = RcRef {
            w: w.clone(),
            sh: shared,
        };
        rc.with(|sh, st, cx| sh.after(st, cx));
        if let Some(n) = &rc.sh.node {
            n.contexts.lock().push(Arc::downgrade(&rc.sh.node_events));
        }
        Ok(Self { rc })
    }

    /// The effective configuration: the inline threshold as the device caps it, and the
    /// largest message as the pool can hold one beside the receive buffers.
    pub fn config(&self) -> &Config {
        &self.rc.sh.cfg
    }

    /// The largest payload actually sent inline (the configured threshold, capped by the
    /// device).
    pub fn inline_max(&self) -> usize {
        self.rc.sh.inline_max
    }

    /// Connects an endpoint to a listener at `addr`.
    ///
    /// # Errors
    /// `Bootstrap` when the exchange fails (refused, garbage, version mismatch, timeout),
    /// `Verbs` when the queue pair cannot be set up.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        self.connect_with(addr, &[])
    }

    /// [`connect`](Self::connect), sending `data` with the connection (a role, a node id:
    /// at most 4 KiB); the accepted endpoint shows it ([`Endpoint::peer_data`]), and ours
    /// shows what the listener answered with ([`Listener::set_accept_data`]).
    ///
    /// # Errors
    /// As `connect`; `InvalidArgument` for more than 4 KiB of data.
    pub fn connect_with(&self, addr: impl ToSocketAddrs, data: &[u8]) -> Result<Endpoint> {
        let addr = resolve(addr)?;
        let e = crate::conn::connect(&self.rc, addr, data)?;
        Ok(Endpoint::new(self.rc.clone(), e.key, e.id, addr))
    }

    /// Connects an endpoint of this transport to a new endpoint of `peer` (another
    /// transport in this process, usually on another worker) directly, with no side
    /// channel: each side's description is handed to the other. Returns (ours, the peer's);
    /// their [`peer_addr`](Endpoint::peer_addr)s are the other side's device address. For
    /// tests, simulations and processes that hold both ends.
    ///
    /// # Errors
    /// `InvalidArgument` for a transport on an XRC node (XRC endpoints are set up through
    /// the side channel); `Verbs` when a queue pair cannot be set up; what a real exchange
    /// would refuse (`check_peer`: a device that cannot reach the other, a mismatch).
    pub fn connect_local(&self, peer: &Self) -> Result<(Endpoint, Endpoint)> {
        let (a, b) = crate::conn::connect_local(&self.rc, &peer.rc)?;
        let (to_peer, to_us) = (
            crate::conn::device_addr(&peer.rc),
            crate::conn::device_addr(&self.rc),
        );
        Ok((
            Endpoint::new(self.rc.clone(), a.key, a.id, to_peer),
            Endpoint::new(peer.rc.clone(), b.key, b.id, to_us),
        ))
    }

    /// Starts accepting endpoints on `addr` (the TCP side channel). The listener keeps
    /// `handle`'s worker running.
    ///
    /// # Errors
    /// `Bootstrap` when the address cannot be bound.
    pub fn listen(&self, addr: impl ToSocketAddrs, handle: &WorkerHandle) -> Result<Listener> {
        let addr = resolve(addr)?;
        let tcp = bootstrap::listen(addr)?;
        let local = tcp
            .local_addr()
            .map_err(|error| bootstrap::BootstrapError::Io {
                op: "local_addr",
                error,
            })?;
        Ok(Listener {
            rc: self.clone(),
            handle: handle.clone(),
            tcp,
            local,
            exchanges: Arc::new(crate::accept::Exchanges::new(
                self.rc.sh.cfg.connect_timeout,
            )),
        })
    }

    /// Registers `len` zeroed bytes that peers may read, write and use atomics on
    /// ([`register_with`](Self::register_with) [`RemoteAccess::All`]).
    ///
    /// # Errors
    /// `Verbs` when registration fails.
    pub fn register(&self, len: usize) -> Result<LocalRegion> {
        self.register_with(len, RemoteAccess::All)
    }

    /// Registers `len` zeroed bytes that peers may access as `access` allows (give peers
    /// no more than they need: a region they only read is [`RemoteAccess::Read`]).
    ///
    /// # Errors
    /// `Verbs` when registration fails.
    pub fn register_with(&self, len: usize, access: RemoteAccess) -> Result<LocalRegion> {
        let mr = self.rc.sh.pd.reg_mr(len, access.flags())?;
        Ok(LocalRegion { mr })
    }

    /// Counters of the transport (`events_dropped` is the worker's: see
    /// `Worker::events_dropped`).
    pub fn stats(&self) -> Stats {
        let mut ws = self.rc.w.lock();
        let events_dropped = ws.events_dropped();
        self.rc.on(&mut ws, |_, st, _| Stats {
            recv_held: st.held,
            credits_outstanding: st.budget.outstanding,
            events_dropped,
            ..st.stats
        })
    }

    /// Number of endpoints in the table (including ones that are down but not yet dropped).
    pub fn endpoint_count(&self) -> usize {
        self.rc.with(|_, st, _| st.eps.len())
    }

    /// Queue pairs this transport created for its endpoints: one per endpoint with RC, one
    /// initiator per remote node with XRC (the node's target queue pairs are counted by
    /// [`Node::target_qps`]).
    pub fn queue_pairs(&self) -> usize {
        self.rc.with(|sh, st, _| {
            if sh.node.is_some() {
                st.initiators.len()
            } else {
                st.eps.len()
            }
        })
    }

    /// Receive buffers posted on the shared receive queue now.
    pub fn posted_receives(&self) -> u64 {
        self.rc.with(|_, st, _| st.budget.posted)
    }

    /// The registration cache's counters (zero-copy sends with
    /// [`Endpoint::send_shared`]).
    pub fn regcache_stats(&self) -> RegCacheStats {
        self.rc.sh.regcache.stats()
    }

    /// Deregisters every cached registration of application bytes that no send is using
    /// (and so releases the cache's references to those bytes); returns how many.
    pub fn flush_regcache(&self) -> usize {
        self.rc.sh.regcache.flush()
    }
}

/// Accepts endpoints on a TCP address.
#[derive(Debug)]
pub struct Listener {
    pub(crate) rc: RcTransport,
    /// Keeps the worker's background thread while the listener is there.
    pub(crate) handle: WorkerHandle,
    pub(crate) tcp: TcpListener,
    local: SocketAddr,
    /// Exchanges with peers under way (`accept.rs`).
    pub(crate) exchanges: Arc<crate::accept::Exchanges>,
}

impl Listener {
    /// Sets the connection data this context's listeners answer with from now on (at most
    /// 4 KiB): connecting endpoints see it as their [`Endpoint::peer_data`].
    ///
    /// # Errors
    /// `InvalidArgument` for more than 4 KiB.
    pub fn set_accept_data(&self, data: &[u8]) -> Result<()> {
        bootstrap::check_app_data(data)?;
        *self.rc.rc.sh.accept_data.lock() = data.to_vec();
        Ok(())
    }

    /// The address it listens on (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits for the next peer and sets up an endpoint with it. A peer that misbehaves
    /// during the exchange gives an error (and is told why when possible); the listener stays
    /// usable.
    ///
    /// Exchanges with several peers run at once (up to 64, each on a thread of its own),
    /// and their endpoints come out in the order the peers connected, except that an
    /// exchange still running after 20 ms holds back no other: a peer that connects and
    /// then says nothing does not stop the others. An exchange still running when the call returns goes
    /// on, and a later call returns its endpoint; one still running when the listener is
    /// dropped ends, and its endpoint is closed.
    ///
    /// An XRC context runs its exchanges one at a time. When another one (this context's own
    /// connect, say) does not finish within 20 ms, the peer is asked to connect again
    /// (`bootstrap::REJECT_BUSY`) and this call goes on to the next connection, so that two
    /// contexts connecting to each other at once do not wait for each other.
    ///
    /// # Errors
    /// `Bootstrap` for a failed exchange, `Verbs` for queue pair set-up failures.
    pub fn accept(&self) -> Result<Endpoint> {
        loop {
            if let Some(ep) =
                crate::accept::accept_until(&self.rc.rc, &self.tcp, &self.exchanges, None)?
            {
                return Ok(ep);
            }
        }
    }

    /// [`accept`](Self::accept), giving up with `Timeout` when no peer connects within
    /// `timeout` (the exchange with a peer that does connect has its own deadline, the
    /// connect timeout). Do not call `accept` on the same listener from another thread
    /// meanwhile.
    ///
    /// # Errors
    /// `Timeout`, or as `accept`.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Endpoint> {
        let start = crate::util::host_now();
        match crate::accept::accept_until(
            &self.rc.rc,
            &self.tcp,
            &self.exchanges,
            Some(far(start, timeout)),
        )? {
            Some(ep) => Ok(ep),
            None => Err(Error::Timeout(start.elapsed())),
        }
    }

    /// The transport it makes endpoints of.
    pub fn transport(&self) -> &RcTransport {
        &self.rc
    }
}
