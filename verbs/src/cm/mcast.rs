//! Multicast on UD IDs (`rdma_join_multicast`, `rdma_leave_multicast`). RoCE needs no
//! subnet manager: joining attaches the ID's QP to the group's GID (the soft device joins
//! the IP group) and reports MULTICAST_JOIN with the group's UD parameters at once.

use std::net::IpAddr;

use super::error::CmError;
use super::event::{CmEvent, CmEventKind, UdParam, status};
use super::id::{CmId, PortSpace, RDMA_UDP_QKEY};
use crate::types::{AhAttr, Gid, Qpn};

impl CmId {
    /// Joins the multicast group `group` (`rdma_join_multicast`). The ID must be bound
    /// (`bind_addr` or `resolve_addr`); its QP, if it has one, is attached to the group.
    /// MULTICAST_JOIN follows with the group's [`UdParam`] (MGID `::ffff:a.b.c.d` for an
    /// IPv4 group, QPN [`Qpn::MULTICAST`], Q_Key [`RDMA_UDP_QKEY`]); MULTICAST_ERROR if
    /// the QP cannot be attached.
    ///
    /// # Errors
    /// `Unsupported` outside the UDP port space; `InvalidArgument` for an address that is
    /// not multicast or a group already joined; `InvalidState` when the ID is not bound.
    pub fn join_multicast(&self, group: IpAddr) -> Result<(), CmError> {
        if self.inner.ps != PortSpace::Udp {
            return Err(CmError::Unsupported("multicast outside the UDP port space"));
        }
        if !group.is_multicast() {
            return Err(CmError::InvalidArgument(format!(
                "{group} is not a multicast address"
            )));
        }
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.join_multicast(self, group);
        }
        if self.inner.ctx.get().is_none() {
            return Err(CmError::InvalidState {
                op: "join a multicast group",
                why: "the ID is not bound (bind_addr / resolve_addr)",
            });
        }
        let mgid = Gid::from_ip(group);
        let mut st = self.inner.st.lock();
        if st.groups.contains(&mgid) {
            return Err(CmError::InvalidArgument(format!(
                "{group} is already joined"
            )));
        }
        let attached = match self.inner.qp.get() {
            Some(qp) => qp.attach_mcast(mgid, 0),
            None => Ok(()),
        };
        match attached {
            Ok(()) => {
                st.groups.push(mgid);
                drop(st);
                let mut ev = CmEvent::new(CmEventKind::MulticastJoin, self.clone());
                ev.ud = Some(UdParam {
                    ah_attr: AhAttr::new(mgid),
                    qp_num: Qpn::MULTICAST,
                    qkey: RDMA_UDP_QKEY,
                });
                self.inner.channel.push(ev);
            }
            Err(e) => {
                drop(st);
                tracing::debug!(error = %e, %group, "rdma_join_multicast: attach failed");
                self.push(CmEventKind::MulticastError, status::INVALID);
            }
        }
        Ok(())
    }

    /// Leaves a group joined with [`join_multicast`](Self::join_multicast)
    /// (`rdma_leave_multicast`): the QP is detached and gets no more of its datagrams.
    ///
    /// # Errors
    /// `InvalidArgument` when the group is not joined; `Verbs` when the QP cannot be
    /// detached.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), CmError> {
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.leave_multicast(self, group);
        }
        let mgid = Gid::from_ip(group);
        let mut st = self.inner.st.lock();
        let Some(i) = st.groups.iter().position(|g| *g == mgid) else {
            return Err(CmError::InvalidArgument(format!("{group} is not joined")));
        };
        if let Some(qp) = self.inner.qp.get() {
            qp.detach_mcast(mgid, 0)?;
        }
        st.groups.swap_remove(i);
        Ok(())
    }
}
