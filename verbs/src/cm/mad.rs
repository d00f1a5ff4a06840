//! CM MADs and their RoCEv2 framing: a 256-byte management datagram (24-byte common MAD
//! header, then the CM message of [`msg`](super::msg)) sent as a UD SEND_ONLY to QP 1.
//!
//! ```text
//! | BTH 12: opcode 0x64, DestQP 1 | DETH 8: Q_Key 0x80010000, SrcQP 1 | MAD 256 | ICRC 4 |
//! MAD header: 0 BaseVersion 1 | 1 MgmtClass 0x07 | 2 ClassVersion 2 | 3 Method 0x03 (Send)
//!             4 Status | 6 ClassSpecific | 8 TransactionID (8) | 16 AttributeID | 18 reserved
//!             20 AttributeModifier | 24.. CM message (232 bytes)
//! ```
//!
//! Decoding never panics and never allocates more than one message: anything that is not a
//! well-formed CM Send MAD to the GSI is an [`MadError`], which the agent counts and drops.

use super::msg::{CM_DATA_LEN, CmData, Ids, Mra, Rej, Rep, Req};
use crate::soft::wire::{
    BthRepr, DethRepr, IcrcPath, Opcode, PacketHeaders, WireError, finish_packet, icrc,
};

/// Bytes in a MAD.
pub const MAD_LEN: usize = 256;
/// Bytes in the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// Base version of the MAD format.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// Class version of the CM.
pub const CM_CLASS_VERSION: u8 = 2;
/// Method Send: every CM message is a Send.
pub const METHOD_SEND: u8 = 0x03;
/// QP number of the general services interface (GSI), where CM MADs go.
pub const GSI_QPN: u32 = 1;
/// Q_Key of the GSI.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// P_Key of the CM's packets (the default partition, full member).
pub const GSI_PKEY: u16 = 0xFFFF;
/// Bytes of a framed CM MAD: BTH, DETH, MAD, ICRC (the MAD needs no pad).
pub const FRAME_LEN: usize = 12 + 8 + MAD_LEN + 4;

/// CM attribute IDs (the message types).
pub mod attr {
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement (answer later).
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a REQ.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request (not used here).
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply (not used here).
    pub const SIDR_REP: u16 = 0x0018;
}

/// One CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    /// Connection request.
    Req(Box<Req>),
    /// Message receipt acknowledgement.
    Mra(Mra),
    /// Reject.
    Rej(Box<Rej>),
    /// Reply.
    Rep(Box<Rep>),
    /// Ready to use.
    Rtu(Ids),
    /// Disconnection request.
    Dreq(Ids),
    /// Disconnection reply.
    Drep(Ids),
}

impl CmMsg {
    /// The attribute ID of this message.
    pub fn attr_id(&self) -> u16 {
        match self {
            Self::Req(_) => attr::REQ,
            Self::Mra(_) => attr::MRA,
            Self::Rej(_) => attr::REJ,
            Self::Rep(_) => attr::REP,
            Self::Rtu(_) => attr::RTU,
            Self::Dreq(_) => attr::DREQ,
            Self::Drep(_) => attr::DREP,
        }
    }

    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Req(_) => "REQ",
            Self::Mra(_) => "MRA",
            Self::Rej(_) => "REJ",
            Self::Rep(_) => "REP",
            Self::Rtu(_) => "RTU",
            Self::Dreq(_) => "DREQ",
            Self::Drep(_) => "DREP",
        }
    }

    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        match self {
            Self::Req(m) => m.local_comm_id,
            Self::Mra(m) => m.local_comm_id,
            Self::Rej(m) => m.local_comm_id,
            Self::Rep(m) => m.local_comm_id,
            Self::Rtu(m) | Self::Dreq(m) | Self::Drep(m) => m.local_comm_id,
        }
    }

    /// The receiver's communication ID (0 in a REQ, which has none yet).
    pub fn remote_comm_id(&self) -> u32 {
        match self {
            Self::Req(_) => 0,
            Self::Mra(m) => m.remote_comm_id,
            Self::Rej(m) => m.remote_comm_id,
            Self::Rep(m) => m.remote_comm_id,
            Self::Rtu(m) | Self::Dreq(m) | Self::Drep(m) => m.remote_comm_id,
        }
    }
}

/// A CM MAD: a transaction ID and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mad {
    /// Transaction ID (a REQ's is reused by its REP, RTU or REJ; a DREQ's by its DREP).
    pub tid: u64,
    /// The message.
    pub msg: CmMsg,
}

/// Why bytes received on a CM socket were dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MadError {
    /// Not a RoCEv2 packet the wire module can parse.
    #[error("not a RoCEv2 packet: {0}")]
    Wire(#[from] WireError),
    /// A RoCEv2 packet, but not a UD SEND_ONLY from QP 1 to QP 1 with the GSI Q_Key.
    #[error("not a GSI datagram")]
    NotGsi,
    /// The invariant CRC does not match.
    #[error("bad ICRC")]
    BadIcrc,
    /// The payload is not exactly one MAD.
    #[error("payload of {0} bytes is not a 256-byte MAD")]
    BadLength(usize),
    /// Base version, management class, class version or method is not a CM Send.
    #[error(
        "not a CM Send MAD (base version {base}, class {class:#x}, version {version}, method {method:#x})"
    )]
    NotCm {
        /// Base version.
        base: u8,
        /// Management class.
        class: u8,
        /// Class version.
        version: u8,
        /// Method.
        method: u8,
    },
    /// An attribute this CM does not handle (SIDR, LAP, APR, or unknown).
    #[error("unsupported CM attribute {0:#06x}")]
    UnknownAttribute(u16),
}

impl Mad {
    /// Writes the 256-byte MAD.
    pub fn emit(&self, out: &mut [u8; MAD_LEN]) {
        out.fill(0);
        let (hdr, data) = out.split_at_mut(MAD_HDR_LEN);
        if let Some(h) = hdr.first_chunk_mut::<MAD_HDR_LEN>() {
            h[0] = BASE_VERSION;
            h[1] = MGMT_CLASS_CM;
            h[2] = CM_CLASS_VERSION;
            h[3] = METHOD_SEND;
            h[8..16].copy_from_slice(&self.tid.to_be_bytes());
            h[16..18].copy_from_slice(&self.msg.attr_id().to_be_bytes());
        }
        let Some(d) = data.first_chunk_mut::<CM_DATA_LEN>() else {
            return;
        };
        match &self.msg {
            CmMsg::Req(m) => m.emit(d),
            CmMsg::Mra(m) => m.emit(d),
            CmMsg::Rej(m) => m.emit(d),
            CmMsg::Rep(m) => m.emit(d),
            CmMsg::Rtu(m) | CmMsg::Drep(m) => m.emit(d, false),
            CmMsg::Dreq(m) => m.emit(d, true),
        }
    }

    /// Decodes a 256-byte MAD.
    ///
    /// # Errors
    /// `BadLength` unless `mad` is 256 bytes; `NotCm` for another class, version or method;
    /// `UnknownAttribute` for a CM attribute not handled here.
    pub fn parse(mad: &[u8]) -> Result<Self, MadError> {
        let mad: &[u8; MAD_LEN] = mad.try_into().map_err(|_| MadError::BadLength(mad.len()))?;
        let (hdr, data) = mad.split_at(MAD_HDR_LEN);
        let (Some(hdr), Some(data)) = (
            hdr.first_chunk::<MAD_HDR_LEN>(),
            data.first_chunk::<CM_DATA_LEN>(),
        ) else {
            return Err(MadError::BadLength(MAD_LEN));
        };
        let [base, class, version, method, ..] = *hdr;
        if (base, class, version, method)
            != (BASE_VERSION, MGMT_CLASS_CM, CM_CLASS_VERSION, METHOD_SEND)
        {
            return Err(MadError::NotCm {
                base,
                class,
                version,
                method,
            });
        }
        let mut tid = [0u8; 8];
        tid.copy_from_slice(&hdr[8..16]);
        let attr_id = u16::from_be_bytes([hdr[16], hdr[17]]);
        let d: &CmData = data;
        let msg = match attr_id {
            attr::REQ => CmMsg::Req(Box::new(Req::parse(d))),
            attr::MRA => CmMsg::Mra(Mra::parse(d)),
            attr::REJ => CmMsg::Rej(Box::new(Rej::parse(d))),
            attr::REP => CmMsg::Rep(Box::new(Rep::parse(d))),
            attr::RTU => CmMsg::Rtu(Ids::parse(d, false)),
            attr::DREQ => CmMsg::Dreq(Ids::parse(d, true)),
            attr::DREP => CmMsg::Drep(Ids::parse(d, false)),
            other => return Err(MadError::UnknownAttribute(other)),
        };
        Ok(Self {
            tid: u64::from_be_bytes(tid),
            msg,
        })
    }

    /// Frames the MAD as a RoCEv2 UD SEND_ONLY from QP 1 to QP 1 (BTH PSN `psn`), with the
    /// ICRC computed for `path` (the CM sockets' addresses).
    pub fn to_frame(&self, psn: u32, path: &IcrcPath) -> [u8; FRAME_LEN] {
        let mut buf = [0u8; FRAME_LEN];
        let mut headers = PacketHeaders::new(BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            pkey: GSI_PKEY,
            fecn: false,
            becn: false,
            dest_qp: GSI_QPN,
            ack_req: false,
            psn,
        });
        headers.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qp: GSI_QPN,
        });
        let mut mad = [0u8; MAD_LEN];
        self.emit(&mut mad);
        // Neither call can fail on this buffer: BTH + DETH + MAD + ICRC is FRAME_LEN.
        if let Ok(hdr_len) = headers.emit(&mut buf) {
            if let Some(dst) = buf.get_mut(hdr_len..hdr_len + MAD_LEN) {
                dst.copy_from_slice(&mad);
            }
            let _ = finish_packet(&mut buf, hdr_len + MAD_LEN, path);
        }
        buf
    }

    /// Decodes a received frame. The ICRC is checked when `path` is given (the sender's and
    /// the receiving socket's addresses; a socket bound to a wildcard address does not know
    /// the packet's destination IP, and then the UDP checksum alone protects the frame).
    ///
    /// # Errors
    /// A [`MadError`] naming the first check that failed.
    pub fn from_frame(frame: &[u8], path: Option<&IcrcPath>) -> Result<Self, MadError> {
        let (headers, payload) = PacketHeaders::parse(frame)?;
        let gsi = headers.bth.opcode == Opcode::UD_SEND_ONLY
            && headers.bth.dest_qp == GSI_QPN
            && headers
                .deth
                .is_some_and(|d| d.qkey == GSI_QKEY && d.src_qp == GSI_QPN);
        if !gsi {
            return Err(MadError::NotGsi);
        }
        if let Some(path) = path
            && !icrc::verify(path, frame)
        {
            return Err(MadError::BadIcrc);
        }
        Self::parse(payload)
    }
}

#[cfg(test)]
#[path = "mad_tests.rs"]
mod tests;
