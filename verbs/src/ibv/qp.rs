//! Queue pairs: creation, attribute conversion, modify, query, destroy; and address handles
//! for UD sends.

use super::{IbvDevice, Ptr, QpEntry, ffi, io_err, last_err, mtu_from};
use crate::error::VerbsError;
use crate::qp_state as state;
use crate::types::{
    AccessFlags, AhAttr, Gid, MigState, QpAttr, QpAttrMask, QpCap, QpState, QpType, Qpn, SendOps,
};
use crate::vocab::QpConfig;

fn raw_cap(c: &QpCap) -> ffi::ibv_qp_cap {
    ffi::ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The capacities libibverbs reports (after `ibv_create_qp*` or from `ibv_query_qp`).
pub(super) fn cap_from(c: &ffi::ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// A RoCE address vector: always global (GRH), no LID.
pub(super) fn raw_ah(a: &AhAttr) -> ffi::ibv_ah_attr {
    ffi::ibv_ah_attr {
        grh: ffi::ibv_global_route {
            dgid: ffi::ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label & 0x000F_FFFF,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: a.port_num,
    }
}

fn ah_from(a: &ffi::ibv_ah_attr) -> AhAttr {
    // SAFETY: every bit pattern of the GID union is a valid byte array.
    let dgid = Gid(unsafe { a.grh.dgid.raw });
    AhAttr {
        dgid,
        sgid_index: a.grh.sgid_index,
        port_num: a.port_num,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        udp_port: 4791,
    }
}

/// The state for an `ibv_qp_state` code; `None` for `IBV_QPS_UNKNOWN` and codes verbs.h
/// does not define.
fn state_from(v: u32) -> Option<QpState> {
    use ffi::ibv_qp_state as s;
    Some(match v {
        s::IBV_QPS_RESET => QpState::Reset,
        s::IBV_QPS_INIT => QpState::Init,
        s::IBV_QPS_RTR => QpState::Rtr,
        s::IBV_QPS_RTS => QpState::Rts,
        s::IBV_QPS_SQD => QpState::Sqd,
        s::IBV_QPS_SQE => QpState::Sqe,
        s::IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

fn mig_from(v: ffi::ibv_mig_state) -> MigState {
    match v {
        ffi::IBV_MIG_REARM => MigState::Rearm,
        ffi::IBV_MIG_ARMED => MigState::Armed,
        _ => MigState::Migrated,
    }
}

fn raw_mig(m: MigState) -> ffi::ibv_mig_state {
    match m {
        MigState::Migrated => ffi::IBV_MIG_MIGRATED,
        MigState::Rearm => ffi::IBV_MIG_REARM,
        MigState::Armed => ffi::IBV_MIG_ARMED,
    }
}

/// Every field of `a` (the mask given to libibverbs selects which are read).
fn raw_attr(a: &QpAttr) -> ffi::ibv_qp_attr {
    ffi::ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: raw_mig(a.path_mig_state),
        qkey: a.qkey,
        rq_psn: a.rq_psn & 0x00FF_FFFF,
        sq_psn: a.sq_psn & 0x00FF_FFFF,
        dest_qp_num: a.dest_qp_num & 0x00FF_FFFF,
        qp_access_flags: a.qp_access_flags.bits() & 0xF,
        cap: raw_cap(&a.cap),
        ah_attr: raw_ah(&a.ah_attr),
        alt_ah_attr: raw_ah(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: 0,
    }
}

fn attr_from(a: &ffi::ibv_qp_attr) -> QpAttr {
    QpAttr {
        // QpState has no "unknown": IBV_QPS_UNKNOWN reads as ERR here (`qp_state`, which
        // the modify check uses, reports it as unknown instead).
        qp_state: state_from(a.qp_state).unwrap_or(QpState::Err),
        cur_qp_state: state_from(a.cur_qp_state).unwrap_or(QpState::Err),
        path_mtu: mtu_from(a.path_mtu),
        path_mig_state: mig_from(a.path_mig_state),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: AccessFlags(a.qp_access_flags & 0xF),
        cap: cap_from(&a.cap),
        ah_attr: ah_from(&a.ah_attr),
        alt_ah_attr: ah_from(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
    }
}

/// Every `IBV_QP_*` attribute bit `ibv_query_qp` may be asked for.
const QUERY_ALL: u32 = (1 << 21) - 1;

impl IbvDevice {
    pub(super) fn create_qp(&self, cfg: &QpConfig) -> Result<Qpn, VerbsError> {
        let qp_type = match cfg.qp_type {
            QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
            QpType::Uc => ffi::ibv_qp_type::IBV_QPT_UC,
            QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
            // An XRC initiator needs no XRC domain: plain ibv_create_qp takes it.
            QpType::XrcSend => ffi::ibv_qp_type::IBV_QPT_XRC_SEND,
            QpType::XrcRecv => return self.create_xrc_target(cfg),
        };
        let (pd, scq, rcq, srq) = {
            let t = self.t.lock();
            let pd = *t
                .pds
                .get(&cfg.pd)
                .ok_or(VerbsError::NoSuchObject("protection domain"))?;
            let cq = |h| {
                t.cqs
                    .get(&h)
                    .copied()
                    .ok_or(VerbsError::NoSuchObject("completion queue"))
            };
            let (scq, rcq) = (cq(cfg.send_cq)?, cq(cfg.recv_cq)?);
            let srq = match cfg.srq {
                Some(h) => t
                    .srqs
                    .get(&h)
                    .copied()
                    .ok_or(VerbsError::NoSuchObject("SRQ"))?,
                None => Ptr(std::ptr::null_mut()),
            };
            (pd, scq, rcq, srq)
        };
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: scq.0,
            recv_cq: rcq.0,
            srq: srq.0,
            cap: raw_cap(&cfg.cap),
            qp_type,
            sq_sig_all: std::os::raw::c_int::from(cfg.sq_sig_all),
        };
        let (qp, qpx, cap) = if cfg.send_ops == SendOps::EMPTY {
            // SAFETY: the PD, CQs and SRQ are live (the caller holds their public objects)
            // and `init` is a live, fully initialised attribute struct the call reads and
            // updates.
            let qp = unsafe { ffi::ibv_create_qp(pd.0, &raw mut init) };
            if qp.is_null() {
                return Err(last_err("ibv_create_qp"));
            }
            (qp, None, cap_from(&init.cap))
        } else {
            // With send ops: the extended QP whose `ibv_wr_*` posting batches use.
            // SAFETY: a plain C struct; all-zero bytes are valid.
            let mut ex: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
            ex.send_cq = init.send_cq;
            ex.recv_cq = init.recv_cq;
            ex.srq = init.srq;
            ex.cap = init.cap;
            ex.qp_type = init.qp_type;
            ex.sq_sig_all = init.sq_sig_all;
            ex.comp_mask = ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            ex.pd = pd.0;
            ex.send_ops_flags = u64::from(cfg.send_ops.bits());
            let qp = self.create_qp_ex(&mut ex)?;
            // SAFETY: a live QP created with send ops, which is an `ibv_qp_ex`.
            let qpx = unsafe { ffi::ibv_qp_to_qp_ex(qp) };
            (qp, (!qpx.is_null()).then_some(Ptr(qpx)), cap_from(&ex.cap))
        };
        // SAFETY: non-null QP just created; its number is a plain field.
        let qpn = unsafe { (*qp).qp_num };
        let entry = QpEntry {
            qp: Ptr(qp),
            pd: cfg.pd,
            qp_type: cfg.qp_type,
            cap,
            qpx,
        };
        self.t.lock().qps.insert(qpn, entry);
        Ok(Qpn(qpn))
    }

    pub(super) fn destroy_qp(&self, qpn: Qpn) {
        let Some(e) = self.t.lock().qps.remove(&qpn.0) else {
            return;
        };
        // SAFETY: live QP removed from the table; destroyed once.
        let rc = unsafe { ffi::ibv_destroy_qp(e.qp.0) };
        if rc != 0 {
            tracing::warn!(qpn = qpn.0, rc, "ibv_destroy_qp failed; leaked");
        }
    }

    pub(super) fn modify_qp(
        &self,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let e = self.qp(qpn).ok_or(VerbsError::NoSuchObject("queue pair"))?;
        // The transition and mask were checked by `QueuePair::modify`; values that do not
        // fit their verbs fields would be truncated on the way to the NIC, so name them.
        state::check_ranges(attr, mask)?;
        let mut raw = raw_attr(attr);
        let bits = std::os::raw::c_int::try_from(mask.bits() & QUERY_ALL).unwrap_or(0);
        // SAFETY: live QP; `raw` is a live, fully initialised attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(e.qp.0, &raw mut raw, bits) };
        if rc != 0 {
            // libibverbs returns the errno (some old providers return -1 and set errno).
            let rc = if rc < 0 {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL)
            } else {
                rc
            };
            return Err(io_err("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// Modifies QP `qpn` with attributes computed by librdmacm (`rdma_init_qp_attr`), handed
    /// to `ibv_modify_qp` as they are: the connection manager's address vector has fields
    /// (LID, SL, static rate) that [`AhAttr`] does not carry. The caller (the connection
    /// manager's libibverbs side) owns the transition; the common check of
    /// `QueuePair::modify` is not made.
    pub(crate) fn modify_qp_raw(
        &self,
        qpn: Qpn,
        attr: &mut ffi::ibv_qp_attr,
        mask: std::os::raw::c_int,
    ) -> Result<(), VerbsError> {
        let e = self.qp(qpn).ok_or(VerbsError::NoSuchObject("queue pair"))?;
        // SAFETY: live QP (in the table, and its QueuePair is held by the caller); `attr` is
        // a live, fully initialised attribute struct the call reads.
        let rc = unsafe { ffi::ibv_modify_qp(e.qp.0, attr, mask) };
        if rc != 0 {
            let rc = if rc < 0 {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL)
            } else {
                rc
            };
            return Err(io_err("ibv_modify_qp", rc));
        }
        Ok(())
    }

    pub(super) fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        let e = self.qp(qpn)?;
        // SAFETY: both are plain C structs (integers, pointers, unions of byte arrays) for
        // which all-zero bytes are valid.
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: live QP; both out-structs are live and correctly sized.
        let rc =
            unsafe { ffi::ibv_query_qp(e.qp.0, &raw mut attr, QUERY_ALL as i32, &raw mut init) };
        if rc != 0 {
            tracing::debug!(qpn = qpn.0, rc, "ibv_query_qp failed");
            return None;
        }
        let a = attr_from(&attr);
        Some((a, cap_from(&init.cap)))
    }

    /// The QP's state alone (`ibv_query_qp` with `IBV_QP_STATE`); `None` for a QP that is
    /// gone, a failed query or a state verbs does not name.
    pub(super) fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        let e = self.qp(qpn)?;
        // SAFETY: both are plain C structs (integers, pointers, unions of byte arrays) for
        // which all-zero bytes are valid.
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as std::os::raw::c_int;
        // SAFETY: live QP; both out-structs are live and correctly sized.
        let rc = unsafe { ffi::ibv_query_qp(e.qp.0, &raw mut attr, mask, &raw mut init) };
        if rc != 0 {
            tracing::debug!(qpn = qpn.0, rc, "ibv_query_qp(IBV_QP_STATE) failed");
            return None;
        }
        state_from(attr.qp_state)
    }

    /// The address handle for UD sends from PD `pd` along `attr`, created on first use and
    /// cached until the device closes (a send's AH must outlive its completion, which the
    /// provider cannot track per WR).
    pub(super) fn ah(&self, pd: u32, attr: &AhAttr) -> Result<Ptr<ffi::ibv_ah>, VerbsError> {
        let mut key = *attr;
        key.udp_port = 0;
        let mut t = self.t.lock();
        if let Some(ah) = t.ahs.get(&(pd, key)) {
            return Ok(*ah);
        }
        let pdp = *t
            .pds
            .get(&pd)
            .ok_or(VerbsError::NoSuchObject("protection domain"))?;
        let mut raw = raw_ah(attr);
        // SAFETY: live PD; `raw` is a live address vector the call reads. The AH is
        // destroyed in `Drop` after the QPs.
        let ah = unsafe { ffi::ibv_create_ah(pdp.0, &raw mut raw) };
        if ah.is_null() {
            return Err(last_err("ibv_create_ah"));
        }
        t.ahs.insert((pd, key), Ptr(ah));
        Ok(Ptr(ah))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verbs_qp_state_maps_to_the_same_number() {
        use ffi::ibv_qp_state as s;
        for code in [
            s::IBV_QPS_RESET,
            s::IBV_QPS_INIT,
            s::IBV_QPS_RTR,
            s::IBV_QPS_RTS,
            s::IBV_QPS_SQD,
            s::IBV_QPS_SQE,
            s::IBV_QPS_ERR,
        ] {
            // `raw_attr` passes states to libibverbs as their discriminant.
            let st = state_from(code).unwrap();
            assert_eq!(st as u32, code, "{st}");
        }
        assert_eq!(state_from(s::IBV_QPS_UNKNOWN), None);
        assert_eq!(state_from(99), None);
    }
}
