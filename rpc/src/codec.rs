//! Bodies: serde values in bincode (varint integers, no trailing bytes, a size limit on
//! decoding so that a length field from the peer cannot make us allocate more, and a
//! nesting limit, [`MAX_DEPTH`], so that a deeply nested body cannot overflow the stack).

use std::io;

use bincode::Options;
use bincode::de::read::BincodeRead;
use serde::Serialize;
use serde::de::{DeserializeOwned, Visitor};

/// The most levels of nesting a body may have (see [`crate::depth`] for what a level is:
/// one per sequence, tuple, struct, map, enum, `Some` or newtype struct entered).
///
/// bincode recurses once per level and has no limit of its own, so without this a peer
/// could send a body of a recursive type (`enum Tree { Leaf(u32), Node(Vec<Tree>) }`)
/// nested deeply enough to overflow the decoding thread's stack, which aborts the process.
/// 128 is far beyond any sane message type and far below what overflows a thread. Measured
/// in a debug build (where frames are largest) on a 2 MiB thread (std's default, and the
/// server's threads'), decoding ever deeper bodies without a limit: through this adaptor a
/// body overflowed the stack at about 1,700 levels of `enum Tree { Leaf(u32),
/// Node(Vec<Tree>) }` (855 nodes of 2 levels each), 2,100 of `struct L { v: u32, next:
/// Option<Box<L>> }` and 2,170 of `enum E { Leaf, Wrap(Box<E>) }` (bincode alone, without
/// the adaptor's frames: 3,660, 4,640 and 7,250): a margin of 13 times or more. (A type
/// that holds kilobytes on the stack at every level overflows sooner: it is the
/// application's to avoid.)
pub(crate) const MAX_DEPTH: usize = 128;

/// The body encoding: bincode's defaults (varint integers, little-endian) with a size limit
/// of `limit` bytes (counted as bytes are read when decoding). Trailing bytes are checked
/// by [`decode_nested`] itself.
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
    decode_nested(bytes, limit, MAX_DEPTH)
}

/// A `T` decoded from `bytes` (all of them), allocating at most `limit` bytes and nested at
/// most `max_depth` levels deep (see [`crate::depth`]).
///
/// # Errors
/// The decoder's, the limits', or "bytes left after the body", in words.
pub(crate) fn decode_nested<T: DeserializeOwned>(
    bytes: &[u8],
    limit: usize,
    max_depth: usize,
) -> Result<T, String> {
    let mut rest = bytes;
    let mut de =
        bincode::Deserializer::with_bincode_read(Slice { rest: &mut rest }, options(limit));
    let value = crate::depth::deserialize(&mut de, max_depth).map_err(|e| e.to_string())?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(format!("{} bytes left after the body", rest.len()))
    }
}

/// bincode's reader of a slice, but over a slice we keep (`rest`, advanced as bytes are
/// read), so that [`decode_nested`] can see what is left at the end: bincode's own slice
/// reader is private to its `Deserializer`, and `Options::deserialize`, which checks for
/// trailing bytes through it, drops the size limit and takes no deserializer adaptor.
struct Slice<'a, 'de> {
    /// The bytes not read yet.
    rest: &'a mut &'de [u8],
}

impl<'de> Slice<'_, 'de> {
    /// The next `n` bytes, or end of file.
    fn take(&mut self, n: usize) -> io::Result<&'de [u8]> {
        let rest: &'de [u8] = self.rest;
        let Some((head, tail)) = rest.split_at_checked(n) else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        *self.rest = tail;
        Ok(head)
    }
}

impl io::Read for Slice<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        // All or nothing, as bincode's slice reader does.
        out.copy_from_slice(self.take(out.len())?);
        Ok(out.len())
    }

    fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        self.read(out).map(|_| ())
    }
}

impl<'de> BincodeRead<'de> for Slice<'_, 'de> {
    fn forward_read_str<V: Visitor<'de>>(
        &mut self,
        length: usize,
        visitor: V,
    ) -> bincode::Result<V::Value> {
        let s = std::str::from_utf8(self.take(length)?)
            .map_err(bincode::ErrorKind::InvalidUtf8Encoding)?;
        visitor.visit_borrowed_str(s)
    }

    fn get_byte_buffer(&mut self, length: usize) -> bincode::Result<Vec<u8>> {
        Ok(self.take(length)?.to_vec())
    }

    fn forward_read_bytes<V: Visitor<'de>>(
        &mut self,
        length: usize,
        visitor: V,
    ) -> bincode::Result<V::Value> {
        visitor.visit_borrowed_bytes(self.take(length)?)
    }
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

    /// Bytes after the body, or a body over the size limit, are still errors now that the
    /// body goes through the nesting adaptor over our own slice reader (the size limit is
    /// one `Options::deserialize` did not enforce: it decodes a slice without one).
    #[test]
    fn trailing_bytes_and_the_size_limit_still_hold() {
        let v = Tree::Node(vec![Tree::Leaf(1), Tree::Node(vec![Tree::Leaf(2)])]);
        let b = encode(&v, 1 << 10).unwrap();
        assert_eq!(decode::<Tree>(&b, 1 << 10).unwrap(), v);
        let mut trailing = b.clone();
        trailing.extend_from_slice(&[0, 0]);
        let e = decode::<Tree>(&trailing, 1 << 10).unwrap_err();
        assert!(e.contains("2 bytes left"), "{e}");
        // The limit counts the bytes read: exactly enough passes, one fewer does not.
        assert_eq!(decode::<Tree>(&b, b.len()).unwrap(), v);
        assert!(decode::<Tree>(&b, b.len() - 1).is_err());
        let blob = encode(&vec![7u8; 100], 1 << 10).unwrap();
        assert_eq!(decode::<Vec<u8>>(&blob, 101).unwrap(), vec![7u8; 100]);
        let e = decode::<Vec<u8>>(&blob, 100).unwrap_err();
        assert!(e.contains("limit"), "{e}");
        let e = decode::<String>(&encode("ab", 16).unwrap(), 2).unwrap_err();
        assert!(e.contains("limit"), "{e}");
        // Truncated and ill-formed bodies fail as before.
        assert!(decode::<Tree>(&b[..b.len() - 1], 1 << 10).is_err());
        assert!(decode::<String>(&[2, 0xff, 0xfe], 16).is_err());
        assert_eq!(decode::<String>(&[2, b'o', b'k'], 16).unwrap(), "ok");
    }

    /// A recursive enum with a sequence: 2 levels a `Node` (the enum and its vector), 1 a
    /// `Leaf`.
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    enum Tree {
        Leaf(u32),
        Node(Vec<Self>),
    }

    /// A recursive newtype variant: 1 level each.
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    enum Chain {
        End,
        Wrap(Box<Self>),
    }

    /// A recursive struct through an option: 2 levels a link (the struct and the `Some`).
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct List {
        v: u32,
        next: Option<Box<Self>>,
    }

    /// A recursive newtype struct around a vector: 2 levels each.
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct Nest(Vec<Self>);

    /// A recursive newtype struct around a map: 2 levels each.
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct Dict(std::collections::BTreeMap<u8, Self>);

    /// A recursive tuple struct: 2 levels each (the tuple struct and the `Some`).
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct Pair(u8, Option<Box<Self>>);

    /// Recursion through a tuple: 3 levels each (the newtype, the `Some`, the tuple), 1 the last.
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct Tup(Option<Box<(Self, u8)>>);

    /// Recursion through struct and tuple variants: 2 levels each (the enum, its fields).
    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    enum Variants {
        End,
        Named { next: Box<Self>, tag: u8 },
        Tuple(u8, Box<Self>),
    }

    /// Builds values `k` steps deep, for `k` from 0.
    type Build<T> = fn(usize) -> T;

    fn tree(k: usize) -> Tree {
        (0..k).fold(Tree::Leaf(7), |t, _| Tree::Node(vec![t]))
    }
    fn chain(k: usize) -> Chain {
        (0..k).fold(Chain::End, |c, _| Chain::Wrap(Box::new(c)))
    }
    fn list(k: usize) -> List {
        (0..k).fold(List { v: 0, next: None }, |l, i| List {
            v: i as u32 + 1,
            next: Some(Box::new(l)),
        })
    }
    fn nest(k: usize) -> Nest {
        (0..k).fold(Nest(Vec::new()), |n, _| Nest(vec![n]))
    }
    fn dict(k: usize) -> Dict {
        (0..k).fold(Dict(Default::default()), |d, i| {
            Dict([(i as u8, d)].into_iter().collect())
        })
    }
    fn pair(k: usize) -> Pair {
        (0..k).fold(Pair(0, None), |p, i| Pair(i as u8, Some(Box::new(p))))
    }
    fn tup(k: usize) -> Tup {
        (0..k).fold(Tup(None), |t, i| Tup(Some(Box::new((t, i as u8)))))
    }
    fn variants(k: usize) -> Variants {
        (0..k).fold(Variants::End, |v, i| {
            if i % 2 == 0 {
                Variants::Named {
                    next: Box::new(v),
                    tag: i as u8,
                }
            } else {
                Variants::Tuple(i as u8, Box::new(v))
            }
        })
    }

    /// The fewest levels `bytes` decode within, as a `T` (and at one fewer, the nesting
    /// error).
    fn depth_of<T: DeserializeOwned + std::fmt::Debug>(bytes: &[u8]) -> usize {
        let d = (0..=MAX_DEPTH)
            .find(|&d| decode_nested::<T>(bytes, 1 << 20, d).is_ok())
            .expect("decodes within the limit");
        if d > 0 {
            let e = decode_nested::<T>(bytes, 1 << 20, d - 1).unwrap_err();
            assert_eq!(e, format!("nesting deeper than {} levels", d - 1));
        }
        d
    }

    /// For a type built `k` steps deep by `build` at `base + k * per_step` levels: the
    /// count is exact, the deepest value within [`MAX_DEPTH`] round-trips through
    /// [`decode`], one step more is refused with the nesting error.
    fn check<T>(build: Build<T>, base: usize, per_step: usize)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        for k in 0..4 {
            let b = encode(&build(k), 1 << 20).unwrap();
            assert_eq!(
                depth_of::<T>(&b),
                base + k * per_step,
                "{} {k} steps",
                std::any::type_name::<T>()
            );
        }
        let deepest = (MAX_DEPTH - base) / per_step;
        for k in [0, 1, deepest / 2, deepest] {
            let v = build(k);
            let b = encode(&v, 1 << 20).unwrap();
            assert_eq!(decode::<T>(&b, 1 << 20).unwrap(), v, "{k} steps");
        }
        let b = encode(&build(deepest + 1), 1 << 20).unwrap();
        let e = decode::<T>(&b, 1 << 20).unwrap_err();
        assert_eq!(e, format!("nesting deeper than {MAX_DEPTH} levels"));
    }

    #[test]
    fn every_kind_of_nesting_round_trips_within_the_limit() {
        check(tree, 1, 2);
        check(chain, 1, 1);
        check(list, 1, 2);
        check(nest, 2, 2);
        check(dict, 2, 2);
        check(pair, 1, 2);
        check(tup, 1, 3);
        check(variants, 1, 2);
        // Fixed shapes: nested vectors, options, maps, tuples.
        let b = encode(&vec![vec![vec![1u8]]], 64).unwrap();
        assert_eq!(depth_of::<Vec<Vec<Vec<u8>>>>(&b), 3);
        let b = encode(&Some(Some(1u8)), 64).unwrap();
        assert_eq!(depth_of::<Option<Option<u8>>>(&b), 2);
        let b = encode(&None::<Option<u8>>, 64).unwrap();
        assert_eq!(depth_of::<Option<Option<u8>>>(&b), 0);
        let m: std::collections::HashMap<String, Vec<u8>> = [("a".into(), vec![1])].into();
        let b = encode(&m, 64).unwrap();
        assert_eq!(
            depth_of::<std::collections::HashMap<String, Vec<u8>>>(&b),
            2
        );
        let b = encode(&((1u8, 2u8), 3u8), 64).unwrap();
        assert_eq!(depth_of::<((u8, u8), u8)>(&b), 2);
        let b = encode(&7u64, 64).unwrap();
        assert_eq!(depth_of::<u64>(&b), 0);
    }

    /// Exactly [`MAX_DEPTH`] levels decode; one more does not.
    #[test]
    fn the_limit_is_exact() {
        // `MAX_DEPTH - 1` wraps and the end: `MAX_DEPTH` enums.
        let at = encode(&chain(MAX_DEPTH - 1), 1 << 10).unwrap();
        assert_eq!(decode::<Chain>(&at, 1 << 10).unwrap(), chain(MAX_DEPTH - 1));
        let over = encode(&chain(MAX_DEPTH), 1 << 10).unwrap();
        let e = decode::<Chain>(&over, 1 << 10).unwrap_err();
        assert_eq!(e, "nesting deeper than 128 levels");
        // Hand-built, the same: 127 tags of `Wrap`, then `End`.
        let mut hand = vec![1u8; MAX_DEPTH - 1];
        hand.push(0);
        assert_eq!(hand, at);
    }

    /// The depth is of nesting, not of size: siblings each start from their parent's depth.
    #[test]
    fn siblings_do_not_add_up() {
        let wide = Tree::Node(vec![tree(60); 1000]);
        let b = encode(&wide, 1 << 20).unwrap();
        assert_eq!(depth_of::<Tree>(&b), 2 + 121);
        assert_eq!(decode::<Tree>(&b, 1 << 20).unwrap(), wide);
        let lists: Vec<List> = vec![list(63); 100];
        let b = encode(&lists, 1 << 20).unwrap();
        assert_eq!(decode::<Vec<List>>(&b, 1 << 20).unwrap(), lists);
    }

    /// `reps` copies of `step`, then `end`: a hand-built body nested `reps` steps deep
    /// (serializing such a value would itself overflow the stack).
    fn hostile(step: &[u8], reps: usize, end: &[u8]) -> Vec<u8> {
        let mut b = step.repeat(reps);
        b.extend_from_slice(end);
        b
    }

    /// Bodies nested a million levels deep, decoded on a thread with a 256 KiB stack: each
    /// is an error, not a stack overflow (which would abort the test process).
    #[test]
    fn a_million_levels_is_an_error_not_a_stack_overflow() {
        const DEEP: usize = 1_000_000;
        let t = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let errs = [
                    // `Wrap` (variant 1) ... `End` (variant 0).
                    decode::<Chain>(&hostile(&[1], DEEP, &[0]), 16 << 20).map(drop),
                    // `Node` (variant 1) of one element ... `Leaf(0)`.
                    decode::<Tree>(&hostile(&[1, 1], DEEP, &[0, 0]), 16 << 20).map(drop),
                    // `v: 0, next: Some(` ... `v: 0, next: None`.
                    decode::<List>(&hostile(&[0, 1], DEEP, &[0, 0]), 16 << 20).map(drop),
                    // One element ... none.
                    decode::<Nest>(&hostile(&[1], DEEP, &[0]), 16 << 20).map(drop),
                    // One entry with key 0 ... none.
                    decode::<Dict>(&hostile(&[1, 0], DEEP, &[0]), 16 << 20).map(drop),
                    // `Some((` ... `None`.
                    decode::<Tup>(&hostile(&[1], DEEP, &[0]), 16 << 20).map(drop),
                    // `Named { next:` ... `End`.
                    decode::<Variants>(&hostile(&[1], DEEP, &[0]), 16 << 20).map(drop),
                ];
                errs.map(|r| r.unwrap_err())
            })
            .unwrap();
        for e in t.join().expect("the decoding thread survives") {
            assert_eq!(e, "nesting deeper than 128 levels");
        }
    }
}
