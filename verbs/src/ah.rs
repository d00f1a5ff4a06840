//! Address handles: the path of a UD send.

use crate::error::VerbsError;
use crate::pd::ProtectionDomain;
use crate::types::{AhAttr, Gid, Qpn, WcFlags, WorkCompletion};
use crate::wr::{SendWr, UdDest};

pub use crate::grh::{GRH_LEN, grh_destination, grh_source};

/// An address handle (`struct ibv_ah`): where a UD send goes.
#[derive(Debug, Clone)]
pub struct AddressHandle {
    attr: AhAttr,
    _pd: ProtectionDomain,
}

impl AddressHandle {
    pub(crate) fn new(pd: &ProtectionDomain, attr: &AhAttr) -> Result<Self, VerbsError> {
        let ports = pd.context().query_device().phys_port_cnt;
        if attr.port_num == 0 || attr.port_num > ports {
            return Err(VerbsError::InvalidAttribute {
                attr: "port_num",
                reason: format!("port {} does not exist", attr.port_num),
            });
        }
        let gids = pd.context().query_port(attr.port_num)?.gid_tbl_len;
        if u32::from(attr.sgid_index) >= gids {
            return Err(VerbsError::InvalidAttribute {
                attr: "sgid_index",
                reason: format!("port {} has {gids} GID(s)", attr.port_num),
            });
        }
        if attr.dgid.to_ip().is_unspecified() {
            return Err(VerbsError::InvalidAttribute {
                attr: "dgid",
                reason: "the destination GID is unspecified".into(),
            });
        }
        Ok(Self {
            attr: *attr,
            _pd: pd.clone(),
        })
    }

    /// Builds the handle that replies to the sender of a UD receive (`ibv_init_ah_from_wc` +
    /// `ibv_create_ah`): `grh` is the first 40 bytes of the receive buffer.
    ///
    /// # Errors
    /// `InvalidArgument` when the completion has no GRH or the GRH holds no IP header.
    pub fn from_work_completion(
        pd: &ProtectionDomain,
        port_num: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<Self, VerbsError> {
        if !wc.wc_flags.contains(WcFlags::GRH) {
            return Err(VerbsError::InvalidArgument(
                "the completion has no GRH".into(),
            ));
        }
        let src = grh_source(grh).ok_or_else(|| {
            VerbsError::InvalidArgument("the GRH holds neither an IPv4 nor an IPv6 header".into())
        })?;
        let mut attr = AhAttr::new(Gid::from_ip(src));
        attr.port_num = port_num;
        if wc.slid != 0 {
            attr.udp_port = wc.slid;
        }
        Self::new(pd, &attr)
    }

    /// The address vector.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }
}

impl ProtectionDomain {
    /// Creates an address handle for UD sends (`ibv_create_ah`).
    ///
    /// # Errors
    /// `InvalidAttribute` for a port or GID index that does not exist or an unspecified GID.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle, VerbsError> {
        AddressHandle::new(self, attr)
    }
}

impl SendWr<'_> {
    /// Sets the UD destination (`wr.ud.ah`, `remote_qpn`, `remote_qkey`).
    pub fn to(mut self, ah: &AddressHandle, remote_qpn: Qpn, remote_qkey: u32) -> Self {
        self.ud = Some(UdDest {
            ah: *ah.attr(),
            remote_qpn,
            remote_qkey,
        });
        self
    }
}
