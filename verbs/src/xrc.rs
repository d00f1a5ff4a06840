//! XRC: domains, XRC SRQs and target QPs (spec §7). One XRC initiator QP
//! (`QpInitAttr::xrc_send`) reaches every XRC SRQ of the domain behind the remote target QP,
//! naming the SRQ per work request (`SendWr::to_srq`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use crate::device::Context;
use crate::error::VerbsError;
use crate::provider::{Provider, SharedXrcd};

/// An XRC domain (`struct ibv_xrcd`).
#[derive(Debug, Clone)]
pub struct XrcDomain {
    pub(crate) ctx: Context,
    pub(crate) id: u32,
    /// For a soft device that joined a domain another device hosts: the link its XRC SRQs
    /// and targets are created through, and the addresses where the targets receive.
    pub(crate) remote: Option<(Arc<dyn Provider>, Vec<SocketAddr>)>,
}

impl XrcDomain {
    pub(crate) fn open(ctx: &Context) -> Result<Self, VerbsError> {
        let id = ctx.dev().alloc_xrcd()?;
        Ok(Self {
            ctx: ctx.clone(),
            id,
            remote: None,
        })
    }

    /// True when this process reaches the domain through another process that hosts it
    /// (soft provider; see [`Context::open_xrcd_file`]).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The UDP address where the domain's target QPs receive on port `port` (soft
    /// provider): the hosting device's port address, which is this device's own unless
    /// the domain is [remote](Self::is_remote). Remote initiators send there.
    ///
    /// # Errors
    /// `InvalidArgument` for a port that does not exist or a hardware device.
    pub fn target_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        match &self.remote {
            Some((_, ports)) => usize::from(port)
                .checked_sub(1)
                .and_then(|i| ports.get(i))
                .copied()
                .ok_or_else(|| VerbsError::InvalidArgument(format!("port {port} does not exist"))),
            None => self.ctx.dev().port_addr(port),
        }
    }

    /// Whether `qpn` is a target QP of this domain, created by any device or process
    /// sharing it (soft provider; `Unsupported` on hardware, which has no such query).
    ///
    /// # Errors
    /// `Unsupported` as above; `Io` when the domain's host cannot be reached.
    pub fn has_target(&self, qpn: crate::types::Qpn) -> Result<bool, VerbsError> {
        match &self.remote {
            Some((link, _)) => link.xrcd_has_target(self.id, qpn),
            None => self.ctx.dev().xrcd_has_target(self.id, qpn),
        }
    }

    /// The provider SRQs and targets of this domain are created on.
    pub(crate) fn dev(&self) -> Option<Arc<dyn Provider>> {
        self.remote.as_ref().map(|(l, _)| l.clone())
    }
}

impl Context {
    /// Opens a private XRC domain (`ibv_open_xrcd` without a file): its SRQs and targets
    /// are this device's only. See [`open_xrcd_file`](Self::open_xrcd_file) to share one.
    ///
    /// # Errors
    /// `Unsupported` on a device without XRC.
    pub fn open_xrcd(&self) -> Result<XrcDomain, VerbsError> {
        XrcDomain::open(self)
    }

    /// Opens the XRC domain shared by every process (and device) that opens the file at
    /// `path` (`ibv_open_xrcd` with the file's descriptor and `O_CREAT`; the file is
    /// created if missing). A target QP any of them creates delivers into the XRC SRQs of
    /// all of them, so a remote node needs one initiator per node, not per process.
    ///
    /// On the soft provider the first device to open the file hosts the domain: targets and
    /// XRC SRQs live in its NIC, which reaches the other processes' registered memory with
    /// `process_vm_readv`/`process_vm_writev` (so it needs ptrace permission over them: the
    /// same user, or root) and forwards their receive completions. The domain ends with its
    /// host's device; the others then get `SrqError` / `QpFatal` events for their objects
    /// in it. See `soft::xrcd` in the crate source for the details.
    ///
    /// # Errors
    /// `Io` when the file or the domain's socket cannot be used, `Unsupported` on a
    /// provider without shared domains.
    pub fn open_xrcd_file(&self, path: impl AsRef<Path>) -> Result<XrcDomain, VerbsError> {
        Ok(match self.dev().open_xrcd_file(path.as_ref())? {
            SharedXrcd::Local(id) => XrcDomain {
                ctx: self.clone(),
                id,
                remote: None,
            },
            SharedXrcd::Remote { xrcd, link, ports } => XrcDomain {
                ctx: self.clone(),
                id: xrcd,
                remote: Some((link, ports)),
            },
        })
    }
}
