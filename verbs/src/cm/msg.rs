//! The CM messages (IBA vol. 1 §12.6) that follow the 24-byte MAD header: each a plain
//! struct with `parse` (from the 232 bytes of a CM MAD's data) and `emit` (into them).
//!
//! Offsets below are from the start of the message data, i.e. after the MAD header (add 24
//! for the offset in the MAD). Multi-bit fields are big-endian, most significant bit first,
//! as in the IBA tables. Neither `parse` nor `emit` panics on any input: the data is a fixed
//! 232-byte array and every access goes through checked helpers.

use crate::types::Gid;

/// Bytes of CM message data in a MAD (256 - 24).
pub const CM_DATA_LEN: usize = 232;

/// The message data of one CM MAD.
pub type CmData = [u8; CM_DATA_LEN];

/// Private data bytes of a REQ (offset 140).
pub const REQ_PRIVATE_LEN: usize = 92;
/// Private data bytes of a REP (offset 36).
pub const REP_PRIVATE_LEN: usize = 196;
/// Private data bytes of a REJ (offset 84).
pub const REJ_PRIVATE_LEN: usize = 148;
/// Additional rejection information bytes of a REJ (offset 12).
pub const REJ_ARI_LEN: usize = 72;
/// Private data bytes of an MRA (offset 10).
pub const MRA_PRIVATE_LEN: usize = 222;
/// Private data bytes of an RTU (offset 8).
pub const RTU_PRIVATE_LEN: usize = 224;
/// Private data bytes of a DREQ (offset 12).
pub const DREQ_PRIVATE_LEN: usize = 220;
/// Private data bytes of a DREP (offset 8).
pub const DREP_PRIVATE_LEN: usize = 224;

const REQ_PRIVATE_OFF: usize = 140;
const REP_PRIVATE_OFF: usize = 36;
const REJ_PRIVATE_OFF: usize = 84;

/// A REQ (attribute 0x0010): the active side asks for a connection.
///
/// On RoCE the LIDs are unused (0); the soft provider carries its data-path UDP port in
/// `primary_local_lid` (see the module docs of [`cm`](crate::cm)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// Local communication ID (offset 0).
    pub local_comm_id: u32,
    /// Service ID (offset 8): rdma_cm's port space << 16 | port.
    pub service_id: u64,
    /// Local CA GUID (offset 16).
    pub local_ca_guid: u64,
    /// Local Q_Key (offset 28; RD only).
    pub local_qkey: u32,
    /// Local QPN (offset 32, 24 bits).
    pub local_qpn: u32,
    /// Responder resources (offset 35).
    pub responder_resources: u8,
    /// Initiator depth (offset 39).
    pub initiator_depth: u8,
    /// Remote CM response timeout (offset 43, bits 7..3): 4.096 us × 2^value.
    pub remote_cm_response_timeout: u8,
    /// Transport service type (offset 43, bits 2..1): 0 RC, 1 UC.
    pub transport_type: u8,
    /// End-to-end flow control (offset 43, bit 0).
    pub flow_control: bool,
    /// Starting PSN (offset 44, 24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (offset 47, bits 7..3).
    pub local_cm_response_timeout: u8,
    /// Retry count (offset 47, bits 2..0).
    pub retry_count: u8,
    /// Partition key (offset 48).
    pub pkey: u16,
    /// Path MTU code (offset 50, bits 7..4).
    pub path_mtu: u8,
    /// RNR retry count (offset 50, bits 2..0).
    pub rnr_retry_count: u8,
    /// Max CM retries (offset 51, bits 7..4).
    pub max_cm_retries: u8,
    /// The requester uses an SRQ (offset 51, bit 3).
    pub srq: bool,
    /// Primary local port LID (offset 52); the soft device's data UDP port here.
    pub primary_local_lid: u16,
    /// Primary remote port LID (offset 54).
    pub primary_remote_lid: u16,
    /// Primary local port GID (offset 56).
    pub primary_local_gid: Gid,
    /// Primary remote port GID (offset 72).
    pub primary_remote_gid: Gid,
    /// Primary flow label (offset 88, bits 31..12).
    pub primary_flow_label: u32,
    /// Primary packet rate (offset 91, bits 5..0).
    pub primary_packet_rate: u8,
    /// Primary traffic class (offset 92).
    pub primary_traffic_class: u8,
    /// Primary hop limit (offset 93).
    pub primary_hop_limit: u8,
    /// Primary SL (offset 94, bits 7..4).
    pub primary_sl: u8,
    /// Primary subnet local (offset 94, bit 3).
    pub primary_subnet_local: bool,
    /// Primary local ACK timeout (offset 95, bits 7..3).
    pub primary_local_ack_timeout: u8,
    /// Private data (offset 140, 92 bytes). rdma_cm puts its 36-byte header first.
    pub private_data: [u8; REQ_PRIVATE_LEN],
}

impl Req {
    /// Decodes a REQ. The alternate path (offsets 96..140) is ignored.
    pub fn parse(d: &CmData) -> Self {
        let w32 = get32(d, 32);
        let w36 = get32(d, 36);
        let w40 = get32(d, 40);
        let w44 = get32(d, 44);
        let b50 = get8(d, 50);
        let b51 = get8(d, 51);
        let w88 = get32(d, 88);
        let b94 = get8(d, 94);
        Self {
            local_comm_id: get32(d, 0),
            service_id: get64(d, 8),
            local_ca_guid: get64(d, 16),
            local_qkey: get32(d, 28),
            local_qpn: w32 >> 8,
            responder_resources: w32 as u8,
            initiator_depth: w36 as u8,
            remote_cm_response_timeout: (w40 as u8) >> 3,
            transport_type: ((w40 as u8) >> 1) & 3,
            flow_control: w40 & 1 != 0,
            starting_psn: w44 >> 8,
            local_cm_response_timeout: (w44 as u8) >> 3,
            retry_count: (w44 as u8) & 7,
            pkey: get16(d, 48),
            path_mtu: b50 >> 4,
            rnr_retry_count: b50 & 7,
            max_cm_retries: b51 >> 4,
            srq: b51 & 0x08 != 0,
            primary_local_lid: get16(d, 52),
            primary_remote_lid: get16(d, 54),
            primary_local_gid: Gid(get_array(d, 56)),
            primary_remote_gid: Gid(get_array(d, 72)),
            primary_flow_label: w88 >> 12,
            primary_packet_rate: (w88 as u8) & 0x3F,
            primary_traffic_class: get8(d, 92),
            primary_hop_limit: get8(d, 93),
            primary_sl: b94 >> 4,
            primary_subnet_local: b94 & 0x08 != 0,
            primary_local_ack_timeout: get8(d, 95) >> 3,
            private_data: get_array(d, REQ_PRIVATE_OFF),
        }
    }

    /// Encodes the REQ (reserved fields and the alternate path zero).
    pub fn emit(&self, d: &mut CmData) {
        d.fill(0);
        put32(d, 0, self.local_comm_id);
        put64(d, 8, self.service_id);
        put64(d, 16, self.local_ca_guid);
        put32(d, 28, self.local_qkey);
        put32(
            d,
            32,
            (self.local_qpn << 8) | u32::from(self.responder_resources),
        );
        put32(d, 36, u32::from(self.initiator_depth));
        put32(
            d,
            40,
            u32::from((self.remote_cm_response_timeout & 0x1F) << 3)
                | u32::from((self.transport_type & 3) << 1)
                | u32::from(self.flow_control),
        );
        put32(
            d,
            44,
            (self.starting_psn << 8)
                | u32::from((self.local_cm_response_timeout & 0x1F) << 3)
                | u32::from(self.retry_count & 7),
        );
        put16(d, 48, self.pkey);
        put8(d, 50, (self.path_mtu << 4) | (self.rnr_retry_count & 7));
        put8(
            d,
            51,
            (self.max_cm_retries << 4) | if self.srq { 0x08 } else { 0 },
        );
        put16(d, 52, self.primary_local_lid);
        put16(d, 54, self.primary_remote_lid);
        put_bytes(d, 56, &self.primary_local_gid.0);
        put_bytes(d, 72, &self.primary_remote_gid.0);
        put32(
            d,
            88,
            (self.primary_flow_label << 12) | u32::from(self.primary_packet_rate & 0x3F),
        );
        put8(d, 92, self.primary_traffic_class);
        put8(d, 93, self.primary_hop_limit);
        put8(
            d,
            94,
            (self.primary_sl << 4) | if self.primary_subnet_local { 0x08 } else { 0 },
        );
        put8(d, 95, self.primary_local_ack_timeout << 3);
        put_bytes(d, REQ_PRIVATE_OFF, &self.private_data);
    }
}

/// A REP (attribute 0x0013): the passive side accepts.
///
/// The soft provider carries its data-path UDP port in `local_qkey` (valid for RD only in
/// the IBA; see the module docs of [`cm`](crate::cm)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// Local communication ID (offset 0).
    pub local_comm_id: u32,
    /// Remote communication ID (offset 4): the REQ's local one.
    pub remote_comm_id: u32,
    /// Local Q_Key (offset 8); the soft device's data UDP port here.
    pub local_qkey: u32,
    /// Local QPN (offset 12, 24 bits).
    pub local_qpn: u32,
    /// Starting PSN (offset 20, 24 bits).
    pub starting_psn: u32,
    /// Responder resources (offset 24).
    pub responder_resources: u8,
    /// Initiator depth (offset 25).
    pub initiator_depth: u8,
    /// Target ACK delay (offset 26, bits 7..3).
    pub target_ack_delay: u8,
    /// Failover accepted (offset 26, bits 2..1).
    pub failover_accepted: u8,
    /// End-to-end flow control (offset 26, bit 0).
    pub flow_control: bool,
    /// RNR retry count (offset 27, bits 7..5).
    pub rnr_retry_count: u8,
    /// The responder uses an SRQ (offset 27, bit 4).
    pub srq: bool,
    /// Local CA GUID (offset 28).
    pub local_ca_guid: u64,
    /// Private data (offset 36, 196 bytes).
    pub private_data: [u8; REP_PRIVATE_LEN],
}

impl Rep {
    /// Decodes a REP.
    pub fn parse(d: &CmData) -> Self {
        let b26 = get8(d, 26);
        let b27 = get8(d, 27);
        Self {
            local_comm_id: get32(d, 0),
            remote_comm_id: get32(d, 4),
            local_qkey: get32(d, 8),
            local_qpn: get32(d, 12) >> 8,
            starting_psn: get32(d, 20) >> 8,
            responder_resources: get8(d, 24),
            initiator_depth: get8(d, 25),
            target_ack_delay: b26 >> 3,
            failover_accepted: (b26 >> 1) & 3,
            flow_control: b26 & 1 != 0,
            rnr_retry_count: b27 >> 5,
            srq: b27 & 0x10 != 0,
            local_ca_guid: get64(d, 28),
            private_data: get_array(d, REP_PRIVATE_OFF),
        }
    }

    /// Encodes the REP.
    pub fn emit(&self, d: &mut CmData) {
        d.fill(0);
        put32(d, 0, self.local_comm_id);
        put32(d, 4, self.remote_comm_id);
        put32(d, 8, self.local_qkey);
        put32(d, 12, self.local_qpn << 8);
        put32(d, 20, self.starting_psn << 8);
        put8(d, 24, self.responder_resources);
        put8(d, 25, self.initiator_depth);
        put8(
            d,
            26,
            (self.target_ack_delay << 3)
                | ((self.failover_accepted & 3) << 1)
                | u8::from(self.flow_control),
        );
        put8(
            d,
            27,
            (self.rnr_retry_count << 5) | if self.srq { 0x10 } else { 0 },
        );
        put64(d, 28, self.local_ca_guid);
        put_bytes(d, REP_PRIVATE_OFF, &self.private_data);
    }
}

/// Which message a REJ or an MRA answers (2 bits).
pub mod msg_kind {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message.
    pub const OTHER: u8 = 2;
}

/// A REJ (attribute 0x0012): a REQ or REP is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// Local communication ID (offset 0): the rejecting side's.
    pub local_comm_id: u32,
    /// Remote communication ID (offset 4): the receiver's (0 if unknown).
    pub remote_comm_id: u32,
    /// Message rejected (offset 8, bits 7..6), see [`msg_kind`].
    pub message_rejected: u8,
    /// Reject info length (offset 9, bits 7..1).
    pub reject_info_len: u8,
    /// Reason (offset 10), see [`reason`].
    pub reason: u16,
    /// Additional rejection information (offset 12, 72 bytes).
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data (offset 84, 148 bytes).
    pub private_data: [u8; REJ_PRIVATE_LEN],
}

/// REJ reason codes used here (IBA vol. 1 table "REJ reason").
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the REP was never answered).
    pub const TIMEOUT: u16 = 4;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid service ID (nobody listens).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid LID (here: a REQ without the soft device's UDP port).
    pub const INVALID_LID: u16 = 13;
    /// Consumer defined: the application rejected (`rdma_reject`).
    pub const CONSUMER_DEFINED: u16 = 28;
}

impl Rej {
    /// Decodes a REJ.
    pub fn parse(d: &CmData) -> Self {
        Self {
            local_comm_id: get32(d, 0),
            remote_comm_id: get32(d, 4),
            message_rejected: get8(d, 8) >> 6,
            reject_info_len: get8(d, 9) >> 1,
            reason: get16(d, 10),
            ari: get_array(d, 12),
            private_data: get_array(d, REJ_PRIVATE_OFF),
        }
    }

    /// Encodes the REJ.
    pub fn emit(&self, d: &mut CmData) {
        d.fill(0);
        put32(d, 0, self.local_comm_id);
        put32(d, 4, self.remote_comm_id);
        put8(d, 8, (self.message_rejected & 3) << 6);
        put8(d, 9, (self.reject_info_len & 0x7F) << 1);
        put16(d, 10, self.reason);
        put_bytes(d, 12, &self.ari);
        put_bytes(d, REJ_PRIVATE_OFF, &self.private_data);
    }
}

/// An MRA (attribute 0x0011): "message received, acknowledge later": the sender of a REQ or
/// REP should wait `service_timeout` longer for the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// Local communication ID (offset 0).
    pub local_comm_id: u32,
    /// Remote communication ID (offset 4).
    pub remote_comm_id: u32,
    /// Message MRAed (offset 8, bits 7..6), see [`msg_kind`].
    pub message_mraed: u8,
    /// Service timeout (offset 9, bits 7..3): 4.096 us × 2^value.
    pub service_timeout: u8,
}

impl Mra {
    /// Decodes an MRA (its private data is ignored).
    pub fn parse(d: &CmData) -> Self {
        Self {
            local_comm_id: get32(d, 0),
            remote_comm_id: get32(d, 4),
            message_mraed: get8(d, 8) >> 6,
            service_timeout: get8(d, 9) >> 3,
        }
    }

    /// Encodes the MRA (no private data).
    pub fn emit(&self, d: &mut CmData) {
        d.fill(0);
        put32(d, 0, self.local_comm_id);
        put32(d, 4, self.remote_comm_id);
        put8(d, 8, (self.message_mraed & 3) << 6);
        put8(d, 9, (self.service_timeout & 0x1F) << 3);
    }
}

/// RTU (0x0014), DREQ (0x0015) and DREP (0x0016): two communication IDs (and, for a DREQ,
/// the remote QPN). Their private data is not used by rdma_cm and is sent as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// Local communication ID (offset 0).
    pub local_comm_id: u32,
    /// Remote communication ID (offset 4).
    pub remote_comm_id: u32,
    /// Remote QPN (DREQ only, offset 8, 24 bits).
    pub remote_qpn: u32,
}

impl Ids {
    /// Decodes the IDs (and the DREQ's remote QPN when `dreq`).
    pub fn parse(d: &CmData, dreq: bool) -> Self {
        Self {
            local_comm_id: get32(d, 0),
            remote_comm_id: get32(d, 4),
            remote_qpn: if dreq { get32(d, 8) >> 8 } else { 0 },
        }
    }

    /// Encodes the IDs (and the DREQ's remote QPN when `dreq`).
    pub fn emit(&self, d: &mut CmData, dreq: bool) {
        d.fill(0);
        put32(d, 0, self.local_comm_id);
        put32(d, 4, self.remote_comm_id);
        if dreq {
            put32(d, 8, self.remote_qpn << 8);
        }
    }
}

fn get8(d: &[u8], off: usize) -> u8 {
    d.get(off).copied().unwrap_or(0)
}

fn get16(d: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(get_array(d, off))
}

fn get32(d: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(get_array(d, off))
}

fn get64(d: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(get_array(d, off))
}

/// `N` bytes at `off` (zeros past the end, which a `CmData` never has).
fn get_array<const N: usize>(d: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = off.checked_add(N).and_then(|end| d.get(off..end)) {
        a.copy_from_slice(s);
    }
    a
}

fn put8(d: &mut [u8], off: usize, v: u8) {
    put_bytes(d, off, &[v]);
}

fn put16(d: &mut [u8], off: usize, v: u16) {
    put_bytes(d, off, &v.to_be_bytes());
}

fn put32(d: &mut [u8], off: usize, v: u32) {
    put_bytes(d, off, &v.to_be_bytes());
}

fn put64(d: &mut [u8], off: usize, v: u64) {
    put_bytes(d, off, &v.to_be_bytes());
}

fn put_bytes(d: &mut [u8], off: usize, v: &[u8]) {
    if let Some(s) = off.checked_add(v.len()).and_then(|end| d.get_mut(off..end)) {
        s.copy_from_slice(v);
    }
}
