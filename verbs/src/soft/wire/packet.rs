//! A whole RoCEv2 packet, i.e. one UDP payload: BTH, the extension headers its opcode
//! requires (spec `roce-wire.md` §2.2), payload, pad and ICRC (§3.3, §4).

use core::fmt;
use core::mem;

use super::aeth::{self, AethRepr};
use super::atomic::{self, AtomicAckEthRepr, AtomicEthRepr};
use super::bth::{self, BthRepr};
use super::deth::{self, DethRepr};
use super::icrc::{self, ICRC_LEN, IcrcPath};
use super::opcode::CNP_RESERVED_LEN;
use super::reth::{self, RethRepr};
use super::xrceth::{self, XrcEthRepr};
use super::{Result, WireError, imm};

/// The decoded headers of one packet.
///
/// Which extension headers a packet has is decided by `bth.opcode` ([`Opcode::headers`]);
/// [`PacketHeaders::parse`] fills exactly those options, and [`PacketHeaders::emit`] writes
/// exactly those (ignoring any other option that is `Some`).
///
/// [`Opcode::headers`]: super::Opcode::headers
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHeaders {
    /// Base transport header.
    pub bth: BthRepr,
    /// Datagram extended transport header (UD).
    pub deth: Option<DethRepr>,
    /// XRC extended transport header (XRC requests).
    pub xrceth: Option<XrcEthRepr>,
    /// RDMA extended transport header (WRITE FIRST/ONLY, READ request).
    pub reth: Option<RethRepr>,
    /// Atomic extended transport header (COMPARE_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// ACK extended transport header (ACKs, READ responses FIRST/LAST/ONLY).
    pub aeth: Option<AethRepr>,
    /// Atomic ACK extended transport header (ATOMIC_ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data (`*_WITH_IMMEDIATE`).
    pub immdt: Option<u32>,
    /// R_Key to invalidate (`SEND_*_WITH_INVALIDATE`).
    pub ieth: Option<u32>,
}

impl PacketHeaders {
    /// Headers with the given BTH and no extension header set yet.
    pub const fn new(bth: BthRepr) -> Self {
        Self {
            bth,
            deth: None,
            xrceth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
        }
    }

    /// Parses a UDP payload (BTH .. ICRC). Returns the headers and the payload, with pad and
    /// ICRC stripped. Does **not** check the ICRC (see [`icrc::verify`]).
    ///
    /// Lenient where the spec leaves the decision to the transport: reserved bits, the CNP's
    /// reserved bytes and pad byte values are not checked; a pad count on FIRST/MIDDLE
    /// packets and bytes after the headers of an opcode without payload are passed on (the
    /// responder's length checks, spec §3.3, reject them).
    ///
    /// # Errors
    ///
    /// * [`WireError::Truncated`]: shorter than BTH + extension headers + ICRC;
    /// * [`WireError::BadVersion`]: BTH TVer is not 0;
    /// * [`WireError::UnknownOpcode`]: an opcode we do not support ([`Opcode::headers`]);
    /// * [`WireError::BadLength`]: a pad count larger than what follows the headers, or a
    ///   non-zero pad count on an opcode that carries no payload.
    ///
    /// [`Opcode::headers`]: super::Opcode::headers
    pub fn parse(udp_payload: &[u8]) -> Result<(Self, &[u8])> {
        let (packet, _icrc) = udp_payload
            .split_last_chunk::<ICRC_LEN>()
            .ok_or(WireError::Truncated)?;
        let mut rest = packet;
        let bth = BthRepr::parse(&bth::Packet::new_unchecked(take(
            &mut rest,
            bth::HEADER_LEN,
        )?))?;
        let set = bth
            .opcode
            .headers()
            .ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
        if rest.len() < set.len() {
            return Err(WireError::Truncated);
        }

        // Spec §2.2: BTH, [DETH], [XRCETH], [RETH | AtomicETH], [AETH], [AtomicAckETH],
        // [ImmDt | IETH], payload.
        let mut headers = Self::new(bth);
        if set.deth {
            let view = deth::Packet::new_unchecked(take(&mut rest, deth::HEADER_LEN)?);
            headers.deth = Some(DethRepr::parse(&view)?);
        }
        if set.xrceth {
            let view = xrceth::Packet::new_unchecked(take(&mut rest, xrceth::HEADER_LEN)?);
            headers.xrceth = Some(XrcEthRepr::parse(&view)?);
        }
        if set.reth {
            let view = reth::Packet::new_unchecked(take(&mut rest, reth::HEADER_LEN)?);
            headers.reth = Some(RethRepr::parse(&view)?);
        }
        if set.atomic_eth {
            let view =
                atomic::eth::Packet::new_unchecked(take(&mut rest, atomic::eth::HEADER_LEN)?);
            headers.atomic_eth = Some(AtomicEthRepr::parse(&view)?);
        }
        if set.aeth {
            let view = aeth::Packet::new_unchecked(take(&mut rest, aeth::HEADER_LEN)?);
            headers.aeth = Some(AethRepr::parse(&view)?);
        }
        if set.atomic_ack_eth {
            let view =
                atomic::ack::Packet::new_unchecked(take(&mut rest, atomic::ack::HEADER_LEN)?);
            headers.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&view)?);
        }
        if set.immdt {
            let view = imm::Packet::new_unchecked(take(&mut rest, imm::HEADER_LEN)?);
            headers.immdt = Some(imm::parse(&view)?);
        }
        if set.ieth {
            let view = imm::Packet::new_unchecked(take(&mut rest, imm::HEADER_LEN)?);
            headers.ieth = Some(imm::parse(&view)?);
        }
        if set.cnp {
            take(&mut rest, CNP_RESERVED_LEN)?;
        }

        // Spec §3.3: pad follows the payload and only packets with payload have one.
        let pad = usize::from(bth.pad_count);
        if pad != 0 && !bth.opcode.carries_payload() {
            return Err(WireError::BadLength);
        }
        let payload_len = rest.len().checked_sub(pad).ok_or(WireError::BadLength)?;
        let payload = rest.get(..payload_len).ok_or(WireError::BadLength)?;
        Ok((headers, payload))
    }

    /// Length of the BTH plus the extension headers that `bth.opcode` requires (just the BTH
    /// for an unsupported opcode).
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.bth.opcode.headers().map_or(0, |set| set.len())
    }

    /// Length of the whole UDP payload for `payload_len` bytes of payload: headers, payload,
    /// pad and ICRC.
    pub fn packet_len(&self, payload_len: usize) -> usize {
        let len = self.header_len().saturating_add(payload_len);
        len.saturating_add(len.wrapping_neg() & 3)
            .saturating_add(ICRC_LEN)
    }

    /// Writes the BTH and the extension headers `bth.opcode` requires into
    /// `buf[..header_len()]`, and returns that length. Values come from the options; options
    /// the opcode does not use are ignored. The pad count is written as given;
    /// [`finish_packet`] sets it.
    ///
    /// # Errors
    ///
    /// * [`WireError::UnknownOpcode`]: the opcode is not supported;
    /// * [`WireError::BadLength`]: a header the opcode requires is `None`;
    /// * [`WireError::Truncated`]: `buf` is shorter than [`PacketHeaders::header_len`].
    ///
    /// Nothing is written when an error is returned.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let set = self
            .bth
            .opcode
            .headers()
            .ok_or(WireError::UnknownOpcode(self.bth.opcode.0))?;
        let deth = required(set.deth, self.deth)?;
        let xrceth = required(set.xrceth, self.xrceth)?;
        let reth = required(set.reth, self.reth)?;
        let atomic_eth = required(set.atomic_eth, self.atomic_eth)?;
        let aeth = required(set.aeth, self.aeth)?;
        let atomic_ack_eth = required(set.atomic_ack_eth, self.atomic_ack_eth)?;
        let immdt = required(set.immdt, self.immdt)?;
        let ieth = required(set.ieth, self.ieth)?;

        let len = bth::HEADER_LEN + set.len();
        let mut rest = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        self.bth.emit(&mut bth::Packet::new_unchecked(take_mut(
            &mut rest,
            bth::HEADER_LEN,
        )?));
        if let Some(deth) = deth {
            deth.emit(&mut deth::Packet::new_unchecked(take_mut(
                &mut rest,
                deth::HEADER_LEN,
            )?));
        }
        if let Some(xrceth) = xrceth {
            xrceth.emit(&mut xrceth::Packet::new_unchecked(take_mut(
                &mut rest,
                xrceth::HEADER_LEN,
            )?));
        }
        if let Some(reth) = reth {
            reth.emit(&mut reth::Packet::new_unchecked(take_mut(
                &mut rest,
                reth::HEADER_LEN,
            )?));
        }
        if let Some(atomic_eth) = atomic_eth {
            atomic_eth.emit(&mut atomic::eth::Packet::new_unchecked(take_mut(
                &mut rest,
                atomic::eth::HEADER_LEN,
            )?));
        }
        if let Some(aeth) = aeth {
            aeth.emit(&mut aeth::Packet::new_unchecked(take_mut(
                &mut rest,
                aeth::HEADER_LEN,
            )?));
        }
        if let Some(atomic_ack_eth) = atomic_ack_eth {
            atomic_ack_eth.emit(&mut atomic::ack::Packet::new_unchecked(take_mut(
                &mut rest,
                atomic::ack::HEADER_LEN,
            )?));
        }
        if let Some(immdt) = immdt {
            imm::emit(
                immdt,
                &mut imm::Packet::new_unchecked(take_mut(&mut rest, imm::HEADER_LEN)?),
            );
        }
        if let Some(ieth) = ieth {
            imm::emit(
                ieth,
                &mut imm::Packet::new_unchecked(take_mut(&mut rest, imm::HEADER_LEN)?),
            );
        }
        if set.cnp {
            take_mut(&mut rest, CNP_RESERVED_LEN)?.fill(0);
        }
        Ok(len)
    }
}

impl fmt::Display for PacketHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(deth) = &self.deth {
            write!(f, " {deth}")?;
        }
        if let Some(xrceth) = &self.xrceth {
            write!(f, " {xrceth}")?;
        }
        if let Some(reth) = &self.reth {
            write!(f, " {reth}")?;
        }
        if let Some(atomic_eth) = &self.atomic_eth {
            write!(f, " {atomic_eth}")?;
        }
        if let Some(aeth) = &self.aeth {
            write!(f, " {aeth}")?;
        }
        if let Some(atomic_ack_eth) = &self.atomic_ack_eth {
            write!(f, " {atomic_ack_eth}")?;
        }
        if let Some(immdt) = self.immdt {
            write!(f, " ImmDt=0x{immdt:08x}")?;
        }
        if let Some(ieth) = self.ieth {
            write!(f, " IETH rkey=0x{ieth:08x}")?;
        }
        Ok(())
    }
}

/// Completes a packet in place. `buf[..len]` holds the headers (as written by
/// [`PacketHeaders::emit`]) and the payload. Appends zero pad up to a multiple of 4, writes
/// the pad count into the BTH, and appends the ICRC computed for `path` ([`icrc::compute`]).
/// Returns the total UDP payload length.
///
/// # Errors
///
/// * [`WireError::BadLength`]: `len` is shorter than a BTH;
/// * [`WireError::Truncated`]: `len` exceeds `buf`, or `buf` has no room for pad and ICRC.
///
/// Nothing is written when an error is returned.
pub fn finish_packet(buf: &mut [u8], len: usize, path: &IcrcPath) -> Result<usize> {
    if len < bth::HEADER_LEN {
        return Err(WireError::BadLength);
    }
    // Spec §3.3: PadCnt = (-payload_len) & 3; every header length is a multiple of 4.
    let pad = len.wrapping_neg() & 3;
    let padded = len.checked_add(pad).ok_or(WireError::Truncated)?;
    let total = padded.checked_add(ICRC_LEN).ok_or(WireError::Truncated)?;
    let out = buf.get_mut(..total).ok_or(WireError::Truncated)?;
    let (packet, icrc_slot) = out
        .split_at_mut_checked(padded)
        .ok_or(WireError::Truncated)?;
    if let Some(pad_bytes) = packet.get_mut(len..) {
        pad_bytes.fill(0);
    }
    // `pad` is at most 3.
    bth::Packet::new_unchecked(&mut *packet).set_pad_count(pad as u8);
    let crc = icrc::compute(path, packet);
    if let Ok(slot) = <&mut [u8; ICRC_LEN]>::try_from(icrc_slot) {
        *slot = crc.to_le_bytes();
    }
    Ok(total)
}

/// `Some(value)` if the header is required, `None` if not.
fn required<T>(needed: bool, value: Option<T>) -> Result<Option<T>> {
    match (needed, value) {
        (false, _) => Ok(None),
        (true, Some(value)) => Ok(Some(value)),
        (true, None) => Err(WireError::BadLength),
    }
}

/// Splits `n` bytes off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    let (head, tail) = rest.split_at_checked(n).ok_or(WireError::Truncated)?;
    *rest = tail;
    Ok(head)
}

/// Splits `n` bytes off the front of `rest`, mutably.
fn take_mut<'a>(rest: &mut &'a mut [u8], n: usize) -> Result<&'a mut [u8]> {
    let (head, tail) = mem::take(rest)
        .split_at_mut_checked(n)
        .ok_or(WireError::Truncated)?;
    *rest = tail;
    Ok(head)
}
