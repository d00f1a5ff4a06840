//! The soft provider behind the provider interface: every call runs on the sans-I/O NIC
//! under its lock, and whatever it produced is sent before the call returns.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::driver::{self, ChannelInner, Shared};
use super::engine::{AsyncEvent, QpConfig, SrqState};
use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::provider::{Provider, SharedXrcd, SoftStats};
use crate::types::{
    AccessFlags, DeviceAttr, Gid, Mtu, MwType, PortAttr, PortState, QpAttr, QpAttrMask, QpCap, Qpn,
    SendFlags, SendOps, WorkCompletion,
};
use crate::wr::{MwBindWr, RecvWr, SendWr, WrOpcode};

impl Shared {
    fn port_index(&self, port: u8) -> Result<usize, VerbsError> {
        usize::from(port)
            .checked_sub(1)
            .filter(|&i| i < self.addrs().len())
            .ok_or_else(|| VerbsError::InvalidArgument(format!("port {port} does not exist")))
    }

    fn node_guid(&self) -> u64 {
        let a = self.addrs()[0];
        let ip = match a.ip() {
            std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
            std::net::IpAddr::V6(v6) => (u128::from(v6) as u64) ^ ((u128::from(v6) >> 64) as u64),
        };
        (0x02_00_00u64 << 40) | ((ip & 0xFFFF_FFFF) << 16) | u64::from(a.port())
    }
}

impl Provider for Shared {
    fn query_device(&self) -> DeviceAttr {
        let max_inline_data = self.with_nic(|n, _| n.config().max_inline_data);
        DeviceAttr {
            fw_ver: format!("rdmx-soft {}", env!("CARGO_PKG_VERSION")),
            node_guid: self.node_guid(),
            vendor_id: 0,
            max_mr_size: 1 << 40,
            max_qp: 1 << 20,
            max_qp_wr: 1 << 16,
            max_sge: 32,
            max_cq: 1 << 16,
            max_cqe: 1 << 22,
            max_mr: 1 << 24,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_inline_data,
            phys_port_cnt: self.addrs().len() as u8,
            atomic_glob: true,
            max_srq: 1 << 16,
            xrc: true,
            auto_path_mig: true,
            max_mcast_grp: 1 << 10,
            max_num_tags: crate::soft::engine::MAX_NUM_TAGS,
            memory_windows: true,
        }
    }

    fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        let i = self.port_index(port)?;
        let state = if self.port_is_down(i) {
            PortState::Down
        } else {
            PortState::Active
        };
        Ok(PortAttr {
            state,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.port_mtu(i),
            gid_tbl_len: 1,
            link_layer: "Ethernet",
            max_msg_sz: 1 << 31,
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid, VerbsError> {
        if index != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "GID index {index} does not exist"
            )));
        }
        Ok(Gid::from_ip(self.port_addr(port)?.ip()))
    }

    fn query_gid_type(&self, port: u8, index: u32) -> Result<crate::types::GidType, VerbsError> {
        // One entry per port: the port's address, spoken over UDP.
        self.query_gid(port, index)
            .map(|_| crate::types::GidType::RoceV2)
    }

    fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        Ok(self.addrs()[self.port_index(port)?])
    }

    fn pop_event(&self) -> Option<AsyncEvent> {
        Self::pop_event(self)
    }

    fn event_fd(&self) -> RawFd {
        Self::event_fd(self).raw()
    }

    fn soft_stats(&self) -> Option<SoftStats> {
        Some(SoftStats {
            counters: self.counters(),
            faults: self.fault_stats(),
            tx_errors: self.tx_errors(),
            tx_unreachable: self.tx_unreachable(),
        })
    }

    fn clock(&self) -> crate::os::Clock {
        Self::clock(self)
    }

    fn shutdown(&self) {
        driver::shutdown(self);
    }

    fn alloc_pd(&self) -> Result<u32, VerbsError> {
        Ok(self.with_nic(|n, _| n.alloc_pd()))
    }

    fn reg_mr(
        &self,
        pd: u32,
        mem: &Arc<RegisteredMemory>,
        access: AccessFlags,
    ) -> Result<(u32, u32), VerbsError> {
        // One key serves as both lkey and rkey. With shared XRC domains joined, the
        // registration is mirrored into each host under the same key (a key the host
        // already uses is drawn again).
        let clients = self.xrc_links().clients();
        'draw: for _ in 0..16 {
            let key = self.with_nic(|n, _| n.reg_mr(pd, mem.clone(), access));
            for (i, c) in clients.iter().enumerate() {
                let ok = c.mirror_mr(key, pd, mem.addr(), mem.len() as u64, access);
                if !matches!(ok, Ok(true)) {
                    for c in &clients[..i] {
                        c.unmirror_mr(key);
                    }
                    self.with_nic(|n, _| n.dereg_mr(key));
                    match ok {
                        Ok(_) => continue 'draw,
                        Err(e) => return Err(e),
                    }
                }
            }
            return Ok((key, key));
        }
        Err(VerbsError::ResourceExhausted(
            "memory keys (every key drawn was taken in a shared XRC domain)",
        ))
    }

    fn dereg_mr(&self, key: u32, _mem: &Arc<RegisteredMemory>) {
        // The hosts first: once they answer, none of them writes to the memory any more.
        for c in self.xrc_links().clients() {
            c.unmirror_mr(key);
        }
        // (With windows bound, the NIC keeps its own reference to the memory until they
        // close.)
        self.with_nic(|n, _| n.dereg_mr(key));
    }

    fn dereg_mr_checked(&self, key: u32) -> Result<(), VerbsError> {
        self.with_nic(|n, _| n.dereg_mr_checked(key))?;
        for c in self.xrc_links().clients() {
            c.unmirror_mr(key);
        }
        Ok(())
    }

    fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<(u32, u32), VerbsError> {
        self.with_nic(|n, _| n.alloc_mw(pd, mw_type))
    }

    fn dealloc_mw(&self, mw: u32) {
        self.with_nic(|n, _| n.dealloc_mw(mw));
    }

    fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: SendFlags,
        bind: &MwBindWr,
    ) -> Result<u32, PostError> {
        self.post_with_nic(|n, now| {
            let key = n
                .type1_bind_key(bind.mw)
                .ok_or(PostError::InvalidWorkRequest(
                    "ibv_bind_mw binds type 1 memory windows (type 2: a BindMw work request)",
                ))?;
            let b = MwBindWr {
                rkey: crate::types::Rkey(key),
                type1: true,
                ..*bind
            };
            let mut wr = SendWr::new(wr_id, WrOpcode::BindMw(b), &[]);
            wr.send_flags = flags;
            n.post_send(now, qpn, &wr)?;
            Ok(key)
        })
    }

    fn create_cq(&self, cqe: usize, channel: &Arc<ChannelInner>) -> Result<u32, VerbsError> {
        let id = self.with_nic(|n, _| n.create_cq(cqe));
        self.set_channel(id, channel);
        Ok(id)
    }

    fn destroy_cq(&self, cq: u32) {
        self.clear_channel(cq);
        // Every QP using the CQ holds a reference to it, so none is left here.
        let _ = self.with_nic(|n, _| n.destroy_cq(cq));
    }

    fn poll_cq(&self, cq: u32, wc: &mut [WorkCompletion]) -> usize {
        self.flush_held();
        let n = Self::poll_cq(self, cq, wc);
        if n > 0 || self.progress() == 0 {
            return n;
        }
        Self::poll_cq(self, cq, wc)
    }

    fn req_notify_cq(&self, cq: u32, solicited_only: bool) {
        self.with_nic(|n, _| n.req_notify_cq(cq, solicited_only));
    }

    fn progress(&self) -> usize {
        Self::progress(self)
    }

    fn release(&self) {
        Self::release(self);
    }

    fn park(&self, fd: RawFd, timeout: std::time::Duration) -> std::io::Result<()> {
        Self::park(self, fd, timeout)
    }

    fn batch_posts(&self, on: bool) {
        Self::batch_posts(self, on);
    }

    fn create_qp(&self, cfg: &QpConfig) -> Result<Qpn, VerbsError> {
        self.with_nic(|n, _| n.create_qp(cfg))
    }

    fn destroy_qp(&self, qpn: Qpn) {
        self.with_nic(|n, _| n.destroy_qp(qpn));
    }

    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        self.with_nic(|n, now| n.modify_qp(now, qpn, attr, mask))
    }

    fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        self.with_nic(|n, _| n.query_qp(qpn))
    }

    fn post_send(&self, qpn: Qpn, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        self.post_with_nic(|n, now| {
            for (i, wr) in wrs.iter().enumerate() {
                n.post_send(now, qpn, wr).map_err(|e| (i, e))?;
            }
            Ok(())
        })
    }

    fn post_send_all(
        &self,
        qpn: Qpn,
        wrs: &[SendWr<'_>],
        _send_ops: SendOps,
    ) -> Result<(), (usize, PostError)> {
        self.post_with_nic(|n, _| n.post_send_all(qpn, wrs))
    }

    fn post_recv(&self, qpn: Qpn, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.with_nic(|n, _| n.post_recv(qpn, wr))
    }

    fn attach_mcast(&self, qpn: Qpn, gid: Gid, port: u8) -> Result<(), VerbsError> {
        self.with_nic(|n, _| n.attach_mcast(qpn, gid))?;
        if let Err(e) = self.join_group(usize::from(port).saturating_sub(1), gid.to_ip()) {
            let _ = self.with_nic(|n, _| n.detach_mcast(qpn, gid));
            return Err(e);
        }
        Ok(())
    }

    fn detach_mcast(&self, qpn: Qpn, gid: Gid, port: u8) -> Result<(), VerbsError> {
        self.with_nic(|n, _| n.detach_mcast(qpn, gid))?;
        self.leave_group(usize::from(port).saturating_sub(1), gid.to_ip());
        Ok(())
    }

    fn create_srq(
        &self,
        pd: u32,
        xrc: Option<(u32, u32)>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, VerbsError> {
        self.with_nic(|n, _| match xrc {
            Some((xrcd, cq)) => n.create_xrc_srq(pd, xrcd, cq, max_wr, max_sge),
            None => n.create_srq(pd, max_wr, max_sge),
        })
    }

    fn create_srq_tm(
        &self,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        tm: crate::tm::TmCaps,
        cq: u32,
    ) -> Result<u32, VerbsError> {
        self.with_nic(|n, _| n.create_tm_srq(pd, max_wr, max_sge, tm, cq))
    }

    fn post_srq_ops(
        &self,
        srq: u32,
        ops: &[crate::tm::OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        self.with_nic(|n, _| n.post_srq_ops(srq, ops))
    }

    fn destroy_srq(&self, srq: u32) -> Result<(), VerbsError> {
        self.with_nic(|n, _| n.destroy_srq(srq))
    }

    fn post_srq_recv(&self, srq: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.with_nic(|n, _| n.post_srq_recv(srq, wr))
    }

    fn post_srq_recv_list(&self, srq: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        self.with_nic(|n, _| n.post_srq_recv_list(srq, wrs))
    }

    fn modify_srq(
        &self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        self.with_nic(|n, _| n.modify_srq(srq, max_wr, limit))
    }

    fn query_srq(&self, srq: u32) -> Option<SrqState> {
        self.with_nic(|n, _| n.query_srq(srq))
    }

    fn alloc_xrcd(&self) -> Result<u32, VerbsError> {
        Ok(self.with_nic(|n, _| n.alloc_xrcd()))
    }

    fn xrcd_has_target(&self, xrcd: u32, qpn: Qpn) -> Result<bool, VerbsError> {
        Ok(self.with_nic(|n, _| n.qp_xrcd(qpn)) == Some(xrcd))
    }

    fn open_xrcd_file(&self, path: &std::path::Path) -> Result<SharedXrcd, VerbsError> {
        let me = self.arc().ok_or(VerbsError::NoSuchObject("device"))?;
        Ok(match crate::soft::xrcd::open(&me, path)? {
            crate::soft::xrcd::Attached::Host(x) => SharedXrcd::Local(x),
            crate::soft::xrcd::Attached::Member(c) => SharedXrcd::Remote {
                xrcd: c.xrcd(),
                ports: c.ports().to_vec(),
                link: c,
            },
        })
    }
}
