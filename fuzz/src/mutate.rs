//! Mutations of corpus inputs: bit flips, byte and field sets with boundary values,
//! arithmetic on fields, truncation, extension, insertion, deletion, copies within an input
//! and splicing with another; and, for record inputs ([`crate::records`]), the same on one
//! record plus dropping, duplicating, swapping and borrowing whole records.

use crate::records;
use crate::rng::Rng;

/// Boundary values for 1-, 2-, 4- and 8-byte fields.
const INTERESTING: [u64; 16] = [
    0,
    1,
    2,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x0001_0000,
    0x00FF_FFFF,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    u64::MAX,
];

/// Applies 1, 2, 4 or 8 random mutations to `data`, keeping it at most `max_len` bytes;
/// `other` is another input to splice with.
pub(crate) fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], max_len: usize) {
    let rounds = 1 << rng.below(4);
    for _ in 0..rounds {
        mutate_once(rng, data, other, max_len);
    }
    data.truncate(max_len);
}

/// Mutates record inputs: most of the time one record's datagram, sometimes the record
/// structure. Falls back to [`mutate`] when `data` holds no record.
pub(crate) fn mutate_records(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], max_len: usize) {
    let recs: Vec<(u8, Vec<u8>)> = records::parse(data)
        .into_iter()
        .map(|r| (r.ctrl, r.data.to_vec()))
        .collect();
    if recs.is_empty() {
        mutate(rng, data, other, max_len);
        return;
    }
    let mut recs = recs;
    let theirs: Vec<(u8, Vec<u8>)> = records::parse(other)
        .into_iter()
        .map(|r| (r.ctrl, r.data.to_vec()))
        .collect();
    let rounds = 1 << rng.below(3);
    for _ in 0..rounds {
        let i = rng.below(recs.len());
        match rng.below(16) {
            0..=8 => {
                let (_, d) = &mut recs[i];
                let donor = theirs
                    .get(rng.below(theirs.len().max(1)))
                    .map_or(&[][..], |r| &r.1);
                mutate(rng, d, donor, usize::from(u16::MAX));
            }
            9 => recs[i].0 = rng.byte(),
            10 => recs[i].0 ^= 1 << rng.below(8),
            11 if recs.len() > 1 => {
                recs.remove(i);
            }
            12 => {
                let r = recs[i].clone();
                recs.insert(rng.below(recs.len() + 1), r);
            }
            13 => {
                let j = rng.below(recs.len());
                recs.swap(i, j);
            }
            _ => {
                if let Some(r) = theirs.get(rng.below(theirs.len().max(1))) {
                    recs.insert(rng.below(recs.len() + 1), r.clone());
                }
            }
        }
        recs.truncate(records::MAX_RECORDS);
    }
    *data = records::encode(recs.iter().map(|(c, d)| (*c, &d[..])));
    data.truncate(max_len);
}

/// One mutation.
fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], max_len: usize) {
    let len = data.len();
    match rng.below(14) {
        // Flip a bit.
        0 | 1 if len > 0 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        // Set a byte, at random or to a boundary value.
        2 if len > 0 => {
            let at = rng.below(len);
            data[at] = if rng.one_in(2) {
                rng.byte()
            } else {
                *rng.pick(&INTERESTING) as u8
            };
        }
        // Set a 2-, 4- or 8-byte field to a boundary value, either byte order.
        3 | 4 if len > 1 => {
            let width = *rng.pick(&[2usize, 4, 8]);
            let width = width.min(len);
            let at = rng.below(len - width + 1);
            let value = *rng.pick(&INTERESTING);
            let value = if rng.one_in(4) {
                value.wrapping_neg()
            } else {
                value
            };
            put(data, at, width, value, rng.one_in(2));
        }
        // Add or subtract a little from a field (lengths, sequence numbers, counters).
        5 if len > 0 => {
            let width = *rng.pick(&[1usize, 2, 4]);
            let width = width.min(len);
            let at = rng.below(len - width + 1);
            let big_endian = rng.one_in(2);
            let old = get(data, at, width, big_endian);
            let delta = 1 + rng.below(16) as u64;
            let new = if rng.one_in(2) {
                old.wrapping_add(delta)
            } else {
                old.wrapping_sub(delta)
            };
            put(data, at, width, new, big_endian);
        }
        // Truncate.
        6 if len > 0 => data.truncate(rng.below(len)),
        // Extend with random bytes.
        7 => {
            let n = 1 + rng.below(32);
            for _ in 0..n {
                data.push(rng.byte());
            }
        }
        // Insert random or repeated bytes.
        8 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let fill = rng.byte();
            let random = rng.one_in(2);
            let bytes: Vec<u8> = (0..n)
                .map(|_| if random { rng.byte() } else { fill })
                .collect();
            data.splice(at..at, bytes);
        }
        // Delete a range.
        9 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            data.drain(at..at + n);
        }
        // Copy a range over another place of the input.
        10 if len > 1 => {
            let from = rng.below(len);
            let to = rng.below(len);
            let n = 1 + rng.below((len - from.max(to)).min(32));
            let chunk = data[from..from + n].to_vec();
            data[to..to + n].copy_from_slice(&chunk);
        }
        // Splice: our head, their tail.
        11 | 12 if !other.is_empty() => {
            let cut = rng.below(len + 1);
            let theirs = rng.below(other.len());
            data.truncate(cut);
            data.extend_from_slice(&other[theirs..]);
        }
        // Overwrite with a piece of the other input.
        13 if !other.is_empty() && len > 0 => {
            let from = rng.below(other.len());
            let to = rng.below(len);
            let n = 1 + rng.below((other.len() - from).min(len - to).min(32));
            data[to..to + n].copy_from_slice(&other[from..from + n]);
        }
        _ => {
            if len > 0 {
                let at = rng.below(len);
                data[at] = rng.byte();
            } else {
                data.push(rng.byte());
            }
        }
    }
    data.truncate(max_len);
}

/// Reads a `width`-byte unsigned field at `at`.
fn get(data: &[u8], at: usize, width: usize, big_endian: bool) -> u64 {
    let mut v = 0u64;
    for i in 0..width {
        let b = u64::from(data[at + i]);
        if big_endian {
            v = v << 8 | b;
        } else {
            v |= b << (8 * i);
        }
    }
    v
}

/// Writes the low `width` bytes of `value` at `at`.
fn put(data: &mut [u8], at: usize, width: usize, value: u64, big_endian: bool) {
    for i in 0..width {
        let shift = if big_endian {
            8 * (width - 1 - i)
        } else {
            8 * i
        };
        data[at + i] = (value >> shift) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_within_bounds() {
        let mut rng = Rng::new(1);
        let other = vec![9u8; 40];
        for _ in 0..20_000 {
            let mut d: Vec<u8> = (0..rng.below(64)).map(|i| i as u8).collect();
            mutate(&mut rng, &mut d, &other, 80);
            assert!(d.len() <= 80);
            let mut r = records::encode([(0, &d[..]), (1, &other[..])]);
            mutate_records(&mut rng, &mut r, &other, 200);
            assert!(r.len() <= 200);
        }
    }

    #[test]
    fn fields_round_trip() {
        let mut d = [0u8; 8];
        put(&mut d, 0, 4, 0x0102_0304, true);
        assert_eq!(d[..4], [1, 2, 3, 4]);
        assert_eq!(get(&d, 0, 4, true), 0x0102_0304);
        put(&mut d, 4, 2, 0xABCD, false);
        assert_eq!(d[4..6], [0xCD, 0xAB]);
        assert_eq!(get(&d, 4, 2, false), 0xABCD);
    }
}
