//! Bodies: serde values in bincode (varint integers, no trailing bytes, a size limit on
//! decoding so that a length field from the peer cannot make us allocate more).

use bincode::Options;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn options(limit: usize) -> impl Options {
    bincode::DefaultOptions::new().with_limit(limit as u64)
}

/// `value` encoded, if it fits in `limit` bytes (the tests' form of [`encode_framed`]).
///
/// # Errors
/// The encoder's, or the limit's (in words).
#[cfg(test)]
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T, limit: usize) -> Result<Vec<u8>, String> {
    options(limit).serialize(value).map_err(|e| e.to_string())
}

/// `value` encoded after [`HEADER_LEN`](crate::wire::HEADER_LEN) bytes left for a frame's
/// header (see [`crate::wire::seal`]), if the encoding fits in `limit` bytes: the frame is
/// built in one allocation, without a copy of the body.
///
/// # Errors
/// The encoder's, or the limit's (in words).
pub(crate) fn encode_framed<T: Serialize + ?Sized>(
    value: &T,
    limit: usize,
) -> Result<Vec<u8>, String> {
    let mut v = Vec::with_capacity(crate::wire::HEADER_LEN + 64);
    v.resize(crate::wire::HEADER_LEN, 0);
    options(limit)
        .serialize_into(&mut v, value)
        .map_err(|e| e.to_string())?;
    Ok(v)
}

/// A `T` decoded from `bytes` (all of them), allocating at most `limit` bytes.
///
/// # Errors
/// The decoder's, in words.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], limit: usize) -> Result<T, String> {
    options(limit).deserialize(bytes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_encoding_leaves_room_for_the_header() {
        let f = encode_framed(&(7u32, "x".to_string()), 100).unwrap();
        assert_eq!(
            &f[..crate::wire::HEADER_LEN],
            &[0u8; crate::wire::HEADER_LEN]
        );
        assert_eq!(
            decode::<(u32, String)>(&f[crate::wire::HEADER_LEN..], 100).unwrap(),
            (7, "x".to_string())
        );
        assert!(encode_framed(&vec![0u8; 100], 10).is_err());
    }

    #[test]
    fn round_trip_limits_and_garbage() {
        let v = (7u32, "seven".to_string(), vec![1u8, 2, 3]);
        let b = encode(&v, 1 << 10).unwrap();
        assert_eq!(decode::<(u32, String, Vec<u8>)>(&b, 1 << 10).unwrap(), v);
        assert!(encode(&vec![0u8; 100], 10).is_err());
        // A length field claiming 2^60 bytes does not allocate them.
        let mut lie = encode(&vec![0u8; 4], 64).unwrap();
        lie[0] = 0xfc;
        lie.truncate(1);
        lie.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(decode::<Vec<u8>>(&lie, 1 << 20).is_err());
        let mut trailing = b.clone();
        trailing.push(0);
        assert!(decode::<(u32, String, Vec<u8>)>(&trailing, 1 << 10).is_err());
    }
}
