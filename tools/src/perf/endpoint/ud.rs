//! The UD side of an endpoint: bring-up without a connection, the address handle of the
//! peer, and the check of the GRH in front of received datagrams.

use rdmx::verbs::ah::{GRH_LEN, grh_source};
use rdmx::verbs::{AddressHandle, AhAttr, Gid, QpAttr, QpAttrMask, QpState, Qpn};

use super::Endpoint;
use crate::error::{Error, Result, ResultExt};
use crate::perf::exchange::EndpointInfo;

/// The Q_Key of every UD queue pair of `rdmx perf` (fixed on both sides).
pub(crate) const QKEY: u32 = 0x1111_1111;

/// Where UD sends go.
#[derive(Debug)]
pub(crate) struct UdPeer {
    /// The path to the peer's port.
    pub(crate) ah: AddressHandle,
    /// The peer's QP.
    pub(crate) qpn: Qpn,
}

impl Endpoint {
    /// UD: INIT -> RTR -> RTS (nothing to connect) and the address handle of `remote`.
    /// A message larger than the path MTU is refused here: UD does not segment.
    pub(super) fn connect_ud(&mut self, remote: &EndpointInfo) -> Result<()> {
        let mtu = self.path_mtu(remote)?.bytes();
        if self.layout.size > mtu {
            return Err(Error::msg(format!(
                "UD messages must fit in one packet: {} bytes exceed the path MTU of {mtu} \
                 bytes (this port {}, the peer's {})",
                self.layout.size,
                self.port_mtu.bytes(),
                remote.mtu
            )));
        }
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        self.qp
            .modify(&rtr, QpAttrMask::STATE)
            .ctx("moving the UD QP to RTR")?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.psn,
            ..QpAttr::default()
        };
        self.qp
            .modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .ctx("moving the UD QP to RTS")?;
        let attr = AhAttr::new(Gid(remote.gid)).with_udp_port(remote.udp_port);
        let ah = self
            .pd
            .create_ah(&attr)
            .ctx("creating the address handle of the peer")?;
        self.ud = Some(UdPeer {
            ah,
            qpn: Qpn(remote.qpn),
        });
        self.remote = Some(*remote);
        Ok(())
    }

    /// UD: checks that the GRH in front of the last received datagram names the peer's
    /// address as its source (nothing to check on RC or before anything arrived).
    pub(crate) fn check_grh(&self, what: &str) -> Result<()> {
        let Some(remote) = self.remote else {
            return Ok(());
        };
        if self.layout.grh == 0 || self.recvs_done == 0 {
            return Ok(());
        }
        let grh = self
            .mr
            .to_vec(self.layout.rx_off, GRH_LEN)
            .ctx("reading the GRH")?;
        let want = Gid(remote.gid).to_ip();
        match grh_source(&grh) {
            Some(ip) if ip == want => Ok(()),
            Some(ip) => Err(Error::msg(format!(
                "{what}: the GRH names {ip} as the source, expected the peer's {want}"
            ))),
            None => Err(Error::msg(format!(
                "{what}: the GRH holds neither an IPv4 nor an IPv6 header"
            ))),
        }
    }
}
