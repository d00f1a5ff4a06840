//! XRC nodes: one device with one XRC domain, shared by the XRC contexts built on it, and
//! a context's initiator towards a remote node. Data only (the exchanges that connect them
//! are in `xrc.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rdmx_core::bootstrap::PathInfo;
use rdmx_core::{Error, Result};
use rdmx_verbs::{AsyncEvent, Device, DeviceOptions, ProtectionDomain, QueuePair, XrcDomain};

/// The device events a context of a node has yet to act on (each context of the node hears
/// every event: `NodeInner::share_event`).
pub(crate) type NodeEvents = Mutex<VecDeque<AsyncEvent>>;

/// One device with one XRC domain, shared by the XRC contexts built on it
/// (`ContextBuilder::node`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) inner: Arc<NodeInner>,
}

#[derive(Debug)]
pub(crate) struct NodeInner {
    pub(crate) vctx: rdmx_verbs::Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) xrcd: XrcDomain,
    pub(crate) id: u64,
    /// Target queue pairs this process created, by (remote node, remote initiator QP
    /// number).
    pub(crate) targets: Mutex<HashMap<(u64, u32), QueuePair>>,
    /// The event queues of the node's contexts, which share its device and so its events.
    pub(crate) contexts: Mutex<Vec<Weak<NodeEvents>>>,
}

impl NodeInner {
    /// Destroys the target queue pairs this process made for initiators of `peer_node`
    /// (their initiators' next packets go unanswered); returns how many.
    pub(crate) fn drop_targets_from(&self, peer_node: u64) -> usize {
        let mut targets = self.targets.lock();
        let before = targets.len();
        targets.retain(|&(node, _), _| node != peer_node);
        before - targets.len()
    }

    /// Hands a device event to every live context of the node (each acts on its own
    /// objects; before, only the context that read the event heard of it).
    pub(crate) fn share_event(&self, ev: AsyncEvent) {
        let mut ctxs = self.contexts.lock();
        ctxs.retain(|w| w.strong_count() > 0);
        for c in ctxs.iter().filter_map(Weak::upgrade) {
            c.lock().push_back(ev);
        }
    }

    /// Where the node's targets receive on `port`, when another process hosts the domain.
    pub(crate) fn target_path(&self, port: u8) -> Option<PathInfo> {
        if !self.xrcd.is_remote() {
            return None;
        }
        let a = self.xrcd.target_addr(port).ok()?;
        Some(PathInfo {
            gid: rdmx_verbs::Gid::from_ip(a.ip()).0,
            udp_port: a.port(),
            port_num: port,
        })
    }
}

impl Node {
    /// Opens `device` and an XRC domain on it.
    ///
    /// # Errors
    /// `Verbs` when the device cannot be opened or has no XRC.
    pub fn open(device: &str) -> Result<Self> {
        Self::from_context(Device::open(device)?)
    }

    /// [`open`](Self::open) with device options (soft provider: fault injection).
    ///
    /// # Errors
    /// As `open`.
    pub fn open_with(device: &str, options: DeviceOptions) -> Result<Self> {
        Self::from_context(Device::open_with(device, options)?)
    }

    /// Opens `device` and joins the node shared by every process that opens it with the
    /// same `domain_file` (created if missing): their contexts share one connection per
    /// remote node, initiators and targets alike. On the soft provider the first process to
    /// open the file hosts the domain for the others, and the node ends with that process
    /// (the others' XRC endpoints then fail); see `Context::open_xrcd_file` in rdmx-verbs.
    ///
    /// # Errors
    /// `Verbs` when the device or the domain cannot be opened or the device has no XRC.
    pub fn open_shared(device: &str, domain_file: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::with_domain(Device::open(device)?, Some(domain_file.as_ref()))
    }

    /// [`open_shared`](Self::open_shared) with device options.
    ///
    /// # Errors
    /// As `open_shared`.
    pub fn open_shared_with(
        device: &str,
        options: DeviceOptions,
        domain_file: impl AsRef<std::path::Path>,
    ) -> Result<Self> {
        Self::with_domain(
            Device::open_with(device, options)?,
            Some(domain_file.as_ref()),
        )
    }

    fn from_context(vctx: rdmx_verbs::Context) -> Result<Self> {
        Self::with_domain(vctx, None)
    }

    fn with_domain(vctx: rdmx_verbs::Context, file: Option<&std::path::Path>) -> Result<Self> {
        if !vctx.query_device().xrc {
            return Err(Error::Config(format!("device {} has no XRC", vctx.name())));
        }
        let pd = vctx.alloc_pd()?;
        let (xrcd, id) = match file {
            None => (vctx.open_xrcd()?, crate::util::random_u64()),
            Some(f) => {
                let xrcd = vctx.open_xrcd_file(f)?;
                // Every process of the node must announce the same node: name it after
                // where its targets receive (the host's address) and the domain.
                let at = xrcd.target_addr(1)?;
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in format!("{at}/{}", f.display()).bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
                (xrcd, h)
            }
        };
        Ok(Self {
            inner: Arc::new(NodeInner {
                vctx,
                pd,
                xrcd,
                id,
                targets: Mutex::new(HashMap::new()),
                contexts: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The node's device (the contexts of the node run on it).
    pub fn verbs_context(&self) -> &rdmx_verbs::Context {
        &self.inner.vctx
    }

    /// The node's random identifier (sent to peers).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Target queue pairs this process created on the node (one per remote initiator;
    /// with a node shared by processes, each target is created by one of them).
    pub fn target_qps(&self) -> usize {
        self.inner.targets.lock().len()
    }
}

/// A context's initiator towards one remote node.
#[derive(Debug)]
pub(crate) struct Initiator {
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) psn: u32,
    pub(crate) connected: bool,
    /// The remote node's target it sends to, once connected.
    pub(crate) target: u32,
}
