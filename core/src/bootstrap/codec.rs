//! Frame encoding and decoding: the fixed header and the bincode payload, checked as early
//! as the bytes allow. Pure functions over byte slices, without I/O.

use std::ops::Range;

use bincode::Options;

use super::wire::{BootstrapError, Frame, Header};
use super::{HEADER_LEN, MAGIC, MAX_FRAME, PROTOCOL_VERSION, field};

/// The bincode configuration of the payload: fixed-width little-endian integers, bounded by
/// [`MAX_FRAME`] when decoding, and no trailing bytes allowed.
fn wire_options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(u64::from(MAX_FRAME))
        .reject_trailing_bytes()
}

/// Encodes `frame` with its header.
///
/// A frame whose payload exceeds [`MAX_FRAME`] is still encoded, and [`decode`] refuses it
/// with [`BootstrapError::TooLarge`]; use [`try_encode`] to catch that before sending. Every
/// valid [`EndpointInfo`] (see [`validate`]) fits.
///
/// [`EndpointInfo`]: super::EndpointInfo
/// [`validate`]: super::validate
pub fn encode(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 128);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(&0_u32.to_be_bytes());
    // The size limit of `wire_options` is for decoding hostile input; here we encode our own
    // frame, and too large a frame is reported by the length check in `try_encode`.
    let options = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian();
    // Cannot fail: the writer is a Vec (which never fails), there is no size limit, and the
    // derived `Serialize` impls of `Frame` only emit sequences of known length.
    options
        .serialize_into(&mut out, frame)
        .expect("bincode serialization into a Vec cannot fail");
    let payload_len = u32::try_from(out.len() - HEADER_LEN).unwrap_or(u32::MAX);
    if let Some(length) = out.get_mut(field::LENGTH) {
        length.copy_from_slice(&payload_len.to_be_bytes());
    }
    out
}

/// Encodes `frame` with its header, refusing a payload longer than [`MAX_FRAME`].
///
/// # Errors
///
/// [`BootstrapError::TooLarge`] when the payload would exceed [`MAX_FRAME`] bytes.
pub fn try_encode(frame: &Frame) -> Result<Vec<u8>, BootstrapError> {
    let bytes = encode(frame);
    let payload_len = u32::try_from(bytes.len() - HEADER_LEN).unwrap_or(u32::MAX);
    if payload_len > MAX_FRAME {
        return Err(BootstrapError::TooLarge(payload_len));
    }
    Ok(bytes)
}

/// Reads the frame header at the start of `buf`, whatever its version.
///
/// Returns `Ok(None)` while fewer than [`HEADER_LEN`] bytes are available. The magic is
/// checked as soon as its four bytes are there; the version and length are returned as they
/// are, unchecked, so a peer can always learn the other side's version (see the
/// [module docs](super)).
///
/// # Errors
///
/// [`BootstrapError::BadMagic`] when `buf` does not start with [`MAGIC`].
pub fn decode_header(buf: &[u8]) -> Result<Option<Header>, BootstrapError> {
    check_magic(buf)?;
    let (Some(version), Some(payload_len)) =
        (be_u16(buf, field::VERSION), be_u32(buf, field::LENGTH))
    else {
        return Ok(None);
    };
    Ok(Some(Header {
        version,
        payload_len,
    }))
}

/// Decodes one frame from the start of `buf`.
///
/// Returns `Ok(None)` when `buf` is a valid but incomplete frame (more bytes are needed),
/// and `Ok(Some((frame, consumed)))` when a whole frame was decoded from the first `consumed`
/// bytes; bytes after it are left alone. Checks happen as early as the bytes allow: the magic
/// with 4 bytes, the version with 6, the length with 10, so garbage is refused before the
/// rest of it arrives. Never panics and never allocates more than the payload needs, which is
/// at most [`MAX_FRAME`] bytes.
///
/// # Errors
///
/// [`BootstrapError::BadMagic`], [`BootstrapError::VersionMismatch`],
/// [`BootstrapError::TooLarge`] or [`BootstrapError::Decode`] when the bytes are not a valid
/// frame of our version.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, BootstrapError> {
    check_magic(buf)?;
    check_version(buf)?;
    let Some(header) = decode_header(buf)? else {
        return Ok(None);
    };
    check_length(header.payload_len)?;
    let frame_len = header.frame_len();
    let Some(payload) = buf.get(HEADER_LEN..frame_len) else {
        return Ok(None);
    };
    Ok(Some((decode_payload(payload)?, frame_len)))
}

/// Decodes a payload of exactly `payload.len()` bytes.
pub(super) fn decode_payload(payload: &[u8]) -> Result<Frame, BootstrapError> {
    wire_options()
        .deserialize(payload)
        .map_err(|err| BootstrapError::Decode(err.to_string()))
}

/// Fails unless `buf` starts with [`MAGIC`]; passes while fewer than 4 bytes are there.
pub(super) fn check_magic(buf: &[u8]) -> Result<(), BootstrapError> {
    match buf.get(field::MAGIC) {
        Some(magic) if magic != MAGIC => {
            let mut found = [0_u8; 4];
            found.copy_from_slice(magic);
            Err(BootstrapError::BadMagic(found))
        }
        _ => Ok(()),
    }
}

/// Fails if `buf` carries another version than ours; passes while the version is not there.
pub(super) fn check_version(buf: &[u8]) -> Result<(), BootstrapError> {
    match be_u16(buf, field::VERSION) {
        Some(theirs) if theirs != PROTOCOL_VERSION => Err(BootstrapError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs,
        }),
        _ => Ok(()),
    }
}

/// Fails if an announced payload length exceeds [`MAX_FRAME`].
pub(super) fn check_length(payload_len: u32) -> Result<(), BootstrapError> {
    if payload_len > MAX_FRAME {
        return Err(BootstrapError::TooLarge(payload_len));
    }
    Ok(())
}

/// The big-endian `u16` at `range` of `buf`, if `buf` is long enough.
fn be_u16(buf: &[u8], range: Range<usize>) -> Option<u16> {
    let bytes: [u8; 2] = buf.get(range)?.try_into().ok()?;
    Some(u16::from_be_bytes(bytes))
}

/// The big-endian `u32` at `range` of `buf`, if `buf` is long enough.
fn be_u32(buf: &[u8], range: Range<usize>) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(range)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::bootstrap::fixtures::{rc_info, xrc_info};
    use crate::bootstrap::{
        EndpointInfo, MAX_24BIT, MAX_CREDITS, PathInfo, Transport, VALID_MTUS, validate,
    };

    fn all_frames() -> Vec<Frame> {
        vec![
            Frame::Hello(rc_info()),
            Frame::Accept(xrc_info()),
            Frame::Hello(EndpointInfo {
                srq_nums: (0..4096).collect(),
                ..xrc_info()
            }),
            Frame::Reject("version mismatch: ünïcödé reasons are fine".to_owned()),
            Frame::Reject(String::new()),
        ]
    }

    fn header(version: u16, payload_len: u32) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&version.to_be_bytes());
        bytes.extend_from_slice(&payload_len.to_be_bytes());
        bytes
    }

    /// A frame of our version around an arbitrary payload.
    fn frame_with_payload(payload: &[u8]) -> Vec<u8> {
        let mut bytes = header(PROTOCOL_VERSION, u32::try_from(payload.len()).unwrap());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn every_variant_round_trips() {
        for frame in all_frames() {
            let bytes = encode(&frame);
            assert_eq!(try_encode(&frame).unwrap(), bytes);
            let (decoded, consumed) = decode(&bytes).unwrap().expect("a whole frame");
            assert_eq!(decoded, frame);
            assert_eq!(consumed, bytes.len());
        }
    }

    #[test]
    fn every_prefix_needs_more_bytes() {
        for frame in all_frames() {
            let bytes = encode(&frame);
            for end in 0..bytes.len() {
                assert!(
                    matches!(decode(&bytes[..end]), Ok(None)),
                    "prefix of {end}/{} bytes of {frame:?}: {:?}",
                    bytes.len(),
                    decode(&bytes[..end])
                );
            }
        }
    }

    #[test]
    fn golden_bytes_of_a_reject() {
        let mut expected = b"RDMX\x00\x09\x00\x00\x00\x0e".to_vec();
        expected.extend_from_slice(&[2, 0, 0, 0]); // variant index 2: Reject
        expected.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]); // string length, u64 LE
        expected.extend_from_slice(b"no");
        assert_eq!(encode(&Frame::Reject("no".to_owned())), expected);
    }

    #[test]
    fn decode_consumes_one_frame_and_leaves_the_rest() {
        let first = encode(&Frame::Hello(rc_info()));
        let mut bytes = first.clone();
        bytes.extend_from_slice(&encode(&Frame::Reject("next".to_owned())));
        let (frame, consumed) = decode(&bytes).unwrap().unwrap();
        assert_eq!(frame, Frame::Hello(rc_info()));
        assert_eq!(consumed, first.len());
        let (next, _) = decode(&bytes[consumed..]).unwrap().unwrap();
        assert_eq!(next, Frame::Reject("next".to_owned()));
    }

    #[test]
    fn bad_magic_is_refused_after_four_bytes() {
        assert!(matches!(decode(b"GE"), Ok(None)));
        assert!(matches!(decode(b"GET "), Err(BootstrapError::BadMagic(m)) if m == *b"GET "));
        assert!(matches!(
            decode(b"GET / HTTP/1.1\r\n"),
            Err(BootstrapError::BadMagic(m)) if m == *b"GET "
        ));
        assert!(matches!(
            decode_header(b"rdmx\0\x01"),
            Err(BootstrapError::BadMagic(_))
        ));
    }

    #[test]
    fn another_version_is_refused_after_six_bytes() {
        let v10 = header(10, 5);
        assert!(matches!(
            decode(&v10[..6]),
            Err(BootstrapError::VersionMismatch {
                ours: 9,
                theirs: 10
            })
        ));
        // The header of any version stays readable.
        assert_eq!(decode_header(&v10[..9]).unwrap(), None);
        assert_eq!(
            decode_header(&v10).unwrap(),
            Some(Header {
                version: 10,
                payload_len: 5
            })
        );
    }

    #[test]
    fn an_oversized_length_is_refused_before_the_payload() {
        let at_limit = header(PROTOCOL_VERSION, MAX_FRAME);
        assert!(matches!(decode(&at_limit), Ok(None)));
        let over = header(PROTOCOL_VERSION, MAX_FRAME + 1);
        assert!(matches!(decode(&over), Err(BootstrapError::TooLarge(n)) if n == MAX_FRAME + 1));
        let huge = header(PROTOCOL_VERSION, u32::MAX);
        assert!(matches!(
            decode(&huge),
            Err(BootstrapError::TooLarge(u32::MAX))
        ));
    }

    #[test]
    fn garbage_payloads_are_decode_errors() {
        // Unknown variant index.
        let bytes = frame_with_payload(&[9, 0, 0, 0]);
        assert!(matches!(decode(&bytes), Err(BootstrapError::Decode(_))));
        // Payload shorter than the frame it starts.
        let bytes = frame_with_payload(&[0, 0, 0, 0, 1]);
        assert!(matches!(decode(&bytes), Err(BootstrapError::Decode(_))));
        // Invalid UTF-8 in a reject reason.
        let bytes = frame_with_payload(&[2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xff]);
        assert!(matches!(decode(&bytes), Err(BootstrapError::Decode(_))));
    }

    #[test]
    fn trailing_bytes_inside_the_payload_are_refused() {
        let bytes = encode(&Frame::Reject("x".to_owned()));
        let mut payload = bytes[HEADER_LEN..].to_vec();
        payload.push(0);
        let err = decode(&frame_with_payload(&payload)).unwrap_err();
        assert!(matches!(err, BootstrapError::Decode(_)), "{err:?}");
    }

    #[test]
    fn hostile_sequence_lengths_fail_without_allocating() {
        // A reject whose string claims 2^60 bytes.
        let mut payload = vec![2, 0, 0, 0];
        payload.extend_from_slice(&(1_u64 << 60).to_le_bytes());
        payload.extend_from_slice(b"abc");
        let err = decode(&frame_with_payload(&payload)).unwrap_err();
        assert!(matches!(err, BootstrapError::Decode(_)), "{err:?}");

        // A hello whose SRQ list claims 2^60 entries. With no alternate path the list length
        // sits at payload offset 4 (frame) + 4 (transport) + 12 (qpn, psn, mtu) + 19 (primary)
        // + 1 (None) = 40.
        let info = EndpointInfo {
            alternate: None,
            ..rc_info()
        };
        let mut payload = encode(&Frame::Hello(info))[HEADER_LEN..].to_vec();
        assert_eq!(payload[40..48], [0; 8], "layout changed: fix the offset");
        payload[40..48].copy_from_slice(&(1_u64 << 60).to_le_bytes());
        let err = decode(&frame_with_payload(&payload)).unwrap_err();
        assert!(matches!(err, BootstrapError::Decode(_)), "{err:?}");
    }

    #[test]
    fn oversized_frames_are_not_sent() {
        let frame = Frame::Reject("x".repeat(MAX_FRAME as usize));
        assert!(matches!(try_encode(&frame), Err(BootstrapError::TooLarge(n)) if n > MAX_FRAME));
        // `encode` still produces bytes, which the decoder refuses.
        assert!(matches!(
            decode(&encode(&frame)),
            Err(BootstrapError::TooLarge(_))
        ));
    }

    fn arb_path() -> impl Strategy<Value = PathInfo> {
        (any::<[u8; 16]>(), 1..=u16::MAX, 1..=u8::MAX).prop_map(|(gid, udp_port, port_num)| {
            PathInfo {
                gid,
                udp_port,
                port_num,
            }
        })
    }

    /// Endpoint information that passes [`validate`].
    fn arb_info() -> impl Strategy<Value = EndpointInfo> {
        (
            (
                prop_oneof![
                    Just(Transport::Rc),
                    Just(Transport::Xrc),
                    Just(Transport::Ud)
                ],
                0..=MAX_24BIT,
                0..=MAX_24BIT,
                proptest::sample::select(VALID_MTUS.to_vec()),
                arb_path(),
                proptest::option::of(arb_path()),
                proptest::collection::vec(0..=MAX_24BIT, 0..64),
            ),
            (
                0..=MAX_CREDITS,
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
            ),
            (
                any::<u64>(),
                0..=0xFFFFu32,
                proptest::option::of(0..=MAX_24BIT),
                proptest::option::of(arb_path()),
                proptest::option::of(arb_path()),
                proptest::option::of(0..=MAX_24BIT),
                any::<u32>(),
            ),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(
                |(
                    (transport, qpn, psn, mtu, primary, alternate, srq_nums),
                    (credits, mailbox_addr, mailbox_rkey, max_message, eager_limit, context_id),
                    (node_id, tag, xrc_target, xrc_target_path, xrc_target_alt, xrc_in_use, token),
                    app_data,
                )| EndpointInfo {
                    transport,
                    qpn,
                    psn,
                    mtu,
                    primary,
                    alternate,
                    srq_nums,
                    credits,
                    mailbox_addr,
                    mailbox_rkey,
                    max_message,
                    eager_limit,
                    context_id,
                    node_id,
                    tag,
                    xrc_target,
                    xrc_target_path,
                    xrc_target_alt,
                    xrc_in_use,
                    token,
                    app_data,
                },
            )
    }

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            arb_info().prop_map(Frame::Hello),
            arb_info().prop_map(Frame::Accept),
            ".{0,200}".prop_map(Frame::Reject),
            (0..=MAX_24BIT).prop_map(Frame::XrcTarget),
            Just(Frame::Ready),
            any::<[u8; 32]>().prop_map(Frame::AuthHello),
            (any::<[u8; 32]>(), any::<[u8; 32]>())
                .prop_map(|(nonce, mac)| Frame::AuthChallenge { nonce, mac }),
            any::<[u8; 32]>().prop_map(Frame::AuthProof),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
            let _ = decode_header(&bytes);
        }

        #[test]
        fn arbitrary_payloads_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            // Behind a valid header, so that bincode sees every input.
            let bytes = frame_with_payload(&payload);
            if let Ok(Some((_, consumed))) = decode(&bytes) {
                prop_assert_eq!(consumed, bytes.len());
            }
        }

        #[test]
        fn mutated_frames_never_panic(
            frame in arb_frame(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = encode(&frame);
            for (at, value) in flips {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            let _ = decode(&bytes);
        }

        #[test]
        fn valid_frames_round_trip(frame in arb_frame()) {
            let bytes = try_encode(&frame).unwrap();
            let (decoded, consumed) = decode(&bytes).unwrap().unwrap();
            prop_assert_eq!(consumed, bytes.len());
            if let Frame::Hello(info) | Frame::Accept(info) = &decoded {
                prop_assert!(validate(info).is_ok());
            }
            prop_assert_eq!(decoded, frame);
        }
    }
}
