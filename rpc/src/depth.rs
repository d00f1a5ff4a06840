//! A nesting limit for serde deserializers: [`Depth`] wraps any [`Deserializer`] and fails
//! with an error, instead of recursing further, once values are nested more than a given
//! number of levels deep.
//!
//! bincode (1.3) decodes a recursive type (`enum Tree { Leaf(u32), Node(Vec<Tree>) }`,
//! `struct List { next: Option<Box<List>> }`) by recursion, one group of stack frames per
//! level, and has no limit of its own: a peer that sends a body nested deeply enough
//! overflows the decoding thread's stack, and a stack overflow aborts the whole process.
//! Under [`Depth`] the same body is a decode error.
//!
//! # What counts as a level
//!
//! A level is one compound value being decoded: the adaptor wraps every [`Visitor`] it
//! forwards, and each call of a visitor's [`visit_seq`](Visitor::visit_seq) (sequences,
//! tuples, tuple structs, and structs in a format that is not self-describing),
//! [`visit_map`](Visitor::visit_map) (maps; structs in a self-describing format),
//! [`visit_enum`](Visitor::visit_enum) (an enum's variant and its content),
//! [`visit_some`](Visitor::visit_some) (an option's `Some`) and
//! [`visit_newtype_struct`](Visitor::visit_newtype_struct) holds one level while it runs.
//! The accesses these visitors are handed ([`SeqAccess`], [`MapAccess`], [`EnumAccess`],
//! [`VariantAccess`]) and the deserializers of `Some` and newtype contents are wrapped in
//! turn, so every inner value again goes through the adaptor. A `Box<T>` is decoded as
//! its `T` and adds no level of its own; a recursive type always recurses through one of
//! the compound values above, so each step of its recursion costs at least one level.
//!
//! So a value of `enum E { Leaf, Wrap(Box<E>) }` with `n` `Wrap`s is `n + 1` levels deep
//! (one per enum), `vec![vec![1u8]]` is 2, `Some(Some(1u8))` is 2, `1u8` is 0; a struct
//! `L { next: Option<Box<L>> }` costs 2 levels per link (the struct and the `Some`), and a
//! `Tree::Node(vec![..])` 2 per level (the enum and the vector).
//!
//! The depth lives in one counter shared by all the wrappers of a decoding, raised on entry
//! into a level and lowered on the way out: siblings do not add up, only nesting does.

use std::cell::Cell;
use std::fmt;

use serde::de::{
    DeserializeSeed, Deserializer, EnumAccess, Error, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// A `T` decoded from `deserializer`, failing (with `D::Error::custom`) rather than
/// recursing past `max_depth` levels of nesting (see the [module](self) for what a level
/// is).
///
/// # Errors
/// The deserializer's, or "nesting deeper than `max_depth` levels".
pub(crate) fn deserialize<'de, T, D>(deserializer: D, max_depth: usize) -> Result<T, D::Error>
where
    T: serde::Deserialize<'de>,
    D: Deserializer<'de>,
{
    let depth = Cell::new(0);
    T::deserialize(Depth::new(deserializer, &depth, max_depth))
}

/// The nesting budget of one decoding: the depth now (shared by every wrapper of the
/// decoding) and the most allowed.
#[derive(Debug, Clone, Copy)]
struct Budget<'a> {
    /// Levels entered and not yet left.
    depth: &'a Cell<usize>,
    /// The most levels allowed at once.
    max: usize,
}

impl Budget<'_> {
    /// `f`, run one level deeper; an error of type `E` instead if that is past the limit.
    /// The depth is back to what it was when `f` returns, whatever it returns.
    fn nested<T, E: Error>(self, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let now = self.depth.get();
        if now >= self.max {
            return Err(E::custom(format_args!(
                "nesting deeper than {} levels",
                self.max
            )));
        }
        self.depth.set(now + 1);
        let r = f();
        self.depth.set(now);
        r
    }
}

/// A [`Deserializer`] that forwards to `D` and keeps every value under it, however deeply
/// nested, within a nesting limit (see the [module](self)).
#[derive(Debug)]
pub(crate) struct Depth<'a, D> {
    /// The wrapped deserializer.
    inner: D,
    /// The decoding's depth and limit.
    budget: Budget<'a>,
}

impl<'a, D> Depth<'a, D> {
    /// `inner`, limited to `max` levels, counted in `depth` (the levels already entered:
    /// 0 for a whole decoding).
    pub(crate) fn new(inner: D, depth: &'a Cell<usize>, max: usize) -> Self {
        Self {
            inner,
            budget: Budget { depth, max },
        }
    }
}

/// A [`Visitor`] that forwards to `V`, holding a level while it visits a compound value
/// and handing on wrapped accesses and deserializers.
struct Visit<'a, V> {
    /// The wrapped visitor.
    inner: V,
    /// The decoding's depth and limit.
    budget: Budget<'a>,
}

/// A [`DeserializeSeed`] that forwards to `S` with its deserializer wrapped in [`Depth`]:
/// how the elements of a sequence, the keys and values of a map, and an enum's variant and
/// newtype content stay under the limit.
struct Seed<'a, S> {
    /// The wrapped seed.
    inner: S,
    /// The decoding's depth and limit.
    budget: Budget<'a>,
}

/// A [`SeqAccess`], [`MapAccess`], [`EnumAccess`] or [`VariantAccess`] that forwards to `A`
/// and wraps the seeds and visitors it is given.
struct Access<'a, A> {
    /// The wrapped access.
    inner: A,
    /// The decoding's depth and limit.
    budget: Budget<'a>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Depth {
            inner: deserializer,
            budget: self.budget,
        })
    }
}

/// Forwards `deserialize_*` methods (their arguments as they are, the visitor wrapped).
macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*))*) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            self.inner.$method($($arg,)* Visit { inner: visitor, budget: self.budget })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Depth<'_, D> {
    type Error = D::Error;

    forward! {
        deserialize_any() deserialize_bool()
        deserialize_i8() deserialize_i16() deserialize_i32() deserialize_i64() deserialize_i128()
        deserialize_u8() deserialize_u16() deserialize_u32() deserialize_u64() deserialize_u128()
        deserialize_f32() deserialize_f64() deserialize_char()
        deserialize_str() deserialize_string() deserialize_bytes() deserialize_byte_buf()
        deserialize_option() deserialize_unit() deserialize_seq() deserialize_map()
        deserialize_identifier() deserialize_ignored_any()
        deserialize_unit_struct(name: &'static str)
        deserialize_newtype_struct(name: &'static str)
        deserialize_tuple(len: usize)
        deserialize_tuple_struct(name: &'static str, len: usize)
        deserialize_struct(name: &'static str, fields: &'static [&'static str])
        deserialize_enum(name: &'static str, variants: &'static [&'static str])
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Forwards `visit_*` methods of scalars (nothing nested: no level, nothing to wrap).
macro_rules! scalars {
    ($($method:ident: $ty:ty)*) => {$(
        fn $method<E: Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Visit<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    scalars! {
        visit_bool: bool
        visit_i8: i8 visit_i16: i16 visit_i32: i32 visit_i64: i64 visit_i128: i128
        visit_u8: u8 visit_u16: u16 visit_u32: u32 visit_u64: u64 visit_u128: u128
        visit_f32: f32 visit_f64: f64 visit_char: char
        visit_str: &str visit_borrowed_str: &'de str visit_string: String
        visit_bytes: &[u8] visit_borrowed_bytes: &'de [u8] visit_byte_buf: Vec<u8>
    }

    fn visit_none<E: Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        let budget = self.budget;
        budget.nested(|| {
            self.inner.visit_some(Depth {
                inner: deserializer,
                budget,
            })
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        let budget = self.budget;
        budget.nested(|| {
            self.inner.visit_newtype_struct(Depth {
                inner: deserializer,
                budget,
            })
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        let budget = self.budget;
        budget.nested(|| self.inner.visit_seq(Access { inner: seq, budget }))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let budget = self.budget;
        budget.nested(|| self.inner.visit_map(Access { inner: map, budget }))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        let budget = self.budget;
        budget.nested(|| {
            self.inner.visit_enum(Access {
                inner: data,
                budget,
            })
        })
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.inner.next_element_seed(Seed {
            inner: seed,
            budget: self.budget,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.inner.next_key_seed(Seed {
            inner: seed,
            budget: self.budget,
        })
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.next_value_seed(Seed {
            inner: seed,
            budget: self.budget,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'a, 'de, A: EnumAccess<'de>> EnumAccess<'de> for Access<'a, A> {
    type Error = A::Error;
    type Variant = Access<'a, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        let budget = self.budget;
        let (value, variant) = self.inner.variant_seed(Seed {
            inner: seed,
            budget,
        })?;
        Ok((
            value,
            Access {
                inner: variant,
                budget,
            },
        ))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.newtype_variant_seed(Seed {
            inner: seed,
            budget: self.budget,
        })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(
            len,
            Visit {
                inner: visitor,
                budget: self.budget,
            },
        )
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner.struct_variant(
            fields,
            Visit {
                inner: visitor,
                budget: self.budget,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use bincode::Options;
    use serde::{Deserialize, Deserializer};

    use super::{Depth, deserialize};

    /// JSON (self-describing, so decoded through `deserialize_any`, structs as maps): the
    /// same levels, the same limit.
    #[test]
    fn a_self_describing_format_is_limited_too() {
        let json = |s: &str, max| {
            let mut de = serde_json::Deserializer::from_str(s);
            deserialize::<serde_json::Value, _>(&mut de, max).map_err(|e| e.to_string())
        };
        assert_eq!(json("[[[1]]]", 3).unwrap(), serde_json::json!([[[1]]]));
        let e = json("[[[1]]]", 2).unwrap_err();
        assert!(e.starts_with("nesting deeper than 2 levels"), "{e}");
        assert!(json(r#"{"a":{"b":[]}}"#, 3).is_ok());
        assert!(json(r#"{"a":{"b":[]}}"#, 2).is_err());

        #[derive(Debug, Deserialize, PartialEq)]
        struct Outer {
            inner: Inner,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        struct Inner {
            x: Option<u8>,
        }
        let s = r#"{"inner":{"x":5}}"#;
        let outer = |max| {
            let mut de = serde_json::Deserializer::from_str(s);
            deserialize::<Outer, _>(&mut de, max).map_err(|e| e.to_string())
        };
        // Two maps and a `Some`.
        assert_eq!(
            outer(3).unwrap(),
            Outer {
                inner: Inner { x: Some(5) }
            }
        );
        assert!(outer(2).unwrap_err().starts_with("nesting deeper than 2"));
    }

    /// The counter is back at its start after a decoding, whether it succeeded or failed,
    /// and a decoding that starts deeper has fewer levels left.
    #[test]
    fn the_depth_is_restored_and_shared() {
        let bytes = bincode::options()
            .serialize(&vec![vec![1u8], vec![2]])
            .unwrap();
        let depth = Cell::new(0);
        let mut de = bincode::Deserializer::from_slice(&bytes, bincode::options());
        let v = Vec::<Vec<u8>>::deserialize(Depth::new(&mut de, &depth, 2)).unwrap();
        assert_eq!(v, vec![vec![1], vec![2]]);
        assert_eq!(depth.get(), 0);
        let depth = Cell::new(1);
        let mut de = bincode::Deserializer::from_slice(&bytes, bincode::options());
        assert!(Vec::<Vec<u8>>::deserialize(Depth::new(&mut de, &depth, 2)).is_err());
        assert_eq!(depth.get(), 1);
    }

    /// `is_human_readable` is the wrapped deserializer's.
    #[test]
    fn human_readability_is_forwarded() {
        let depth = Cell::new(0);
        let mut de = serde_json::Deserializer::from_str("1");
        assert!(Depth::new(&mut de, &depth, 1).is_human_readable());
        let mut de = bincode::Deserializer::from_slice(&[1], bincode::options());
        assert!(!Depth::new(&mut de, &depth, 1).is_human_readable());
    }
}
