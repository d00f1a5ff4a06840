//! The table: fixed-size slots in one registered memory region that clients read with
//! RDMA READ (the Pilaf / FaRM design), written only by the server.
//!
//! ```text
//! slot (SLOT_HEADER + max_value bytes), little-endian:
//!  0  version   u64  even: stable; odd: being written; 0: never used
//!  8  key hash  u64
//! 16  key len   u16    18  state u16 (0 empty, 1 live, 2 deleted)
//! 20  value len u32
//! 24  crc32     u32  over the version, the state, the lengths, the key and the value
//! 28  0         u32
//! 32  key       [MAX_KEY]
//! 64  value     [max_value]
//! ```
//!
//! A write makes the version odd, writes the slot, its checksum, then makes the version
//! even again (one writer per slot at a time: a striped lock). A reader that copies a slot
//! while it is written sees an odd version or a checksum that does not match (the version
//! is inside the checksum, so bytes of two different writes do not pass either), and reads
//! again. Keys are placed by the hash of their bytes, probing up to [`PROBE`] slots.

use parking_lot::Mutex;
use rdmx::LocalRegion;

/// Header bytes of a slot (the key included).
pub const SLOT_HEADER: usize = 64;
/// Longest key.
pub const MAX_KEY: usize = 32;
/// Slots a key may be placed in, from its home slot on.
pub const PROBE: usize = 16;
/// Lock stripes.
const STRIPES: usize = 1024;

/// Slot states.
const EMPTY: u16 = 0;
const LIVE: u16 = 1;
const DELETED: u16 = 2;

/// The table's shape: what a client needs to read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// Slots (a power of two).
    pub slots: u64,
    /// Longest value.
    pub max_value: u32,
}

impl Layout {
    /// Bytes of one slot.
    pub fn slot_len(&self) -> usize {
        SLOT_HEADER + self.max_value as usize
    }

    /// Bytes of the region.
    pub fn region_len(&self) -> usize {
        self.slot_len() * self.slots as usize
    }

    /// The home slot of `key`.
    pub fn home(&self, key: &[u8]) -> u64 {
        hash(key) & (self.slots - 1)
    }

    /// The slot `i` probes after `home`.
    pub fn probe(&self, home: u64, i: usize) -> u64 {
        (home + i as u64) & (self.slots - 1)
    }
}

/// FNV-1a, 64 bits; never 0 (0 marks no key).
pub fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// What a slot's bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotView {
    /// Never used, or deleted: a key may still be further along the probe.
    Free {
        /// Never used (the probe can stop here).
        never_used: bool,
    },
    /// A live key and its value.
    Live {
        /// Its key.
        key: Vec<u8>,
        /// Its value.
        value: Vec<u8>,
        /// The slot's version.
        version: u64,
    },
    /// Being written, or torn: read again.
    Unstable,
}

fn checksum(version: u64, state: u16, key: &[u8], value: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&version.to_le_bytes());
    h.update(&state.to_le_bytes());
    h.update(&(key.len() as u16).to_le_bytes());
    h.update(&(value.len() as u32).to_le_bytes());
    h.update(key);
    h.update(value);
    h.finalize()
}

/// Decodes a slot's bytes (as read from the region, locally or with RDMA READ).
pub fn view(slot: &[u8], layout: &Layout) -> SlotView {
    let word = |at: usize, n: usize| -> u64 {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&slot[at..at + n]);
        u64::from_le_bytes(b)
    };
    if slot.len() < SLOT_HEADER {
        return SlotView::Unstable;
    }
    let version = word(0, 8);
    if version == 0 {
        return SlotView::Free { never_used: true };
    }
    if version % 2 == 1 {
        return SlotView::Unstable;
    }
    let key_len = word(16, 2) as usize;
    let state = word(18, 2) as u16;
    let value_len = word(20, 4) as usize;
    let crc = word(24, 4) as u32;
    if key_len > MAX_KEY || value_len > layout.max_value as usize {
        return SlotView::Unstable;
    }
    let Some(value) = slot.get(SLOT_HEADER..SLOT_HEADER + value_len) else {
        return SlotView::Unstable;
    };
    let key = &slot[32..32 + key_len];
    if checksum(version, state, key, value) != crc {
        return SlotView::Unstable;
    }
    match state {
        LIVE => SlotView::Live {
            key: key.to_vec(),
            value: value.to_vec(),
            version,
        },
        DELETED | EMPTY => SlotView::Free { never_used: false },
        _ => SlotView::Unstable,
    }
}

/// Why a write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// The key is empty or too long.
    #[error("keys are 1 to {MAX_KEY} bytes; this one has {0}")]
    Key(usize),
    /// The value is too long.
    #[error("values are at most {max} bytes; this one has {len}")]
    Value {
        /// Its length.
        len: usize,
        /// The table's limit.
        max: usize,
    },
    /// Every slot the key may go in holds another key.
    #[error("the {PROBE} slots this key may go in are taken")]
    Full,
}

/// The server's side of the table.
pub struct Table {
    region: LocalRegion,
    layout: Layout,
    stripes: Vec<Mutex<()>>,
    /// Serializes placing a key (two writers must not place one key in two slots).
    place: Mutex<()>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// A table of `layout` in `region` (at least `layout.region_len()` bytes, zeroed).
    pub fn new(region: LocalRegion, layout: Layout) -> Self {
        Self {
            region,
            layout,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            place: Mutex::new(()),
        }
    }

    /// Its layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The region's descriptor, for clients.
    pub fn remote(&self) -> rdmx::RemoteRegion {
        self.region.remote()
    }

    fn offset(&self, slot: u64) -> usize {
        slot as usize * self.layout.slot_len()
    }

    fn read_slot(&self, slot: u64) -> Vec<u8> {
        self.region
            .memory()
            .to_vec(self.offset(slot), self.layout.slot_len())
            .unwrap_or_default()
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let home = self.layout.home(key);
        for i in 0..PROBE {
            let s = self.layout.probe(home, i);
            let _g = self.stripes[s as usize % STRIPES].lock();
            match view(&self.read_slot(s), &self.layout) {
                SlotView::Live { key: k, value, .. } if k == key => return Some(value),
                SlotView::Free { never_used: true } => return None,
                _ => {}
            }
        }
        None
    }

    /// Writes slot `s` (its stripe locked by the caller).
    fn write_slot(&self, s: u64, state: u16, key: &[u8], value: &[u8]) {
        let mem = self.region.memory();
        let off = self.offset(s);
        let old = mem.read_u64(off).unwrap_or(0);
        let v = (old | 1).wrapping_add(2) & !1; // the next even version after `old`
        let _ = mem.write_u64(off, v - 1); // odd: being written
        let mut head = [0u8; SLOT_HEADER];
        head[8..16].copy_from_slice(&hash(key).to_le_bytes());
        head[16..18].copy_from_slice(&(key.len() as u16).to_le_bytes());
        head[18..20].copy_from_slice(&state.to_le_bytes());
        head[20..24].copy_from_slice(&(value.len() as u32).to_le_bytes());
        head[24..28].copy_from_slice(&checksum(v, state, key, value).to_le_bytes());
        head[32..32 + key.len()].copy_from_slice(key);
        let _ = mem.write(off + 8, &head[8..]);
        let _ = mem.write(off + SLOT_HEADER, value);
        let _ = mem.write_u64(off, v); // even: stable
    }

    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// [`TableError`].
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), TableError> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(TableError::Key(key.len()));
        }
        if value.len() > self.layout.max_value as usize {
            return Err(TableError::Value {
                len: value.len(),
                max: self.layout.max_value as usize,
            });
        }
        let home = self.layout.home(key);
        // Where the key is, else the first free slot of its probe.
        let _p = self.place.lock();
        let mut free = None;
        for i in 0..PROBE {
            let s = self.layout.probe(home, i);
            let g = self.stripes[s as usize % STRIPES].lock();
            match view(&self.read_slot(s), &self.layout) {
                SlotView::Live { key: k, .. } if k == key => {
                    self.write_slot(s, LIVE, key, value);
                    drop(g);
                    return Ok(());
                }
                SlotView::Free { never_used } => {
                    free.get_or_insert(s);
                    if never_used {
                        break;
                    }
                }
                _ => {}
            }
        }
        let s = free.ok_or(TableError::Full)?;
        let _g = self.stripes[s as usize % STRIPES].lock();
        self.write_slot(s, LIVE, key, value);
        Ok(())
    }

    /// Deletes `key`; whether it was there.
    pub fn delete(&self, key: &[u8]) -> bool {
        let home = self.layout.home(key);
        let _p = self.place.lock();
        for i in 0..PROBE {
            let s = self.layout.probe(home, i);
            let _g = self.stripes[s as usize % STRIPES].lock();
            match view(&self.read_slot(s), &self.layout) {
                SlotView::Live { key: k, .. } if k == key => {
                    self.write_slot(s, DELETED, &[], &[]);
                    return true;
                }
                SlotView::Free { never_used: true } => return false,
                _ => {}
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots come from the server's memory over the network: any bytes decode to a view,
    /// never a panic; a slot written with one checksum and read with a byte changed is
    /// never taken for a live value.
    #[test]
    fn any_slot_bytes_decode_and_damage_is_caught() {
        let layout = Layout {
            slots: 16,
            max_value: 64,
        };
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..100_000 {
            let n = (next() % 160) as usize;
            let mut b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            if b.len() >= 8 && next() % 2 == 0 {
                b[..8].copy_from_slice(&((next() % 64) * 2).to_le_bytes());
            }
            let _ = view(&b, &layout);
        }
        // A well-formed slot, then each byte of it changed.
        let key = b"user000000000042";
        let value = [9u8; 40];
        let mut slot = vec![0u8; layout.slot_len()];
        slot[..8].copy_from_slice(&8u64.to_le_bytes());
        slot[8..16].copy_from_slice(&hash(key).to_le_bytes());
        slot[16..18].copy_from_slice(&(key.len() as u16).to_le_bytes());
        slot[18..20].copy_from_slice(&LIVE.to_le_bytes());
        slot[20..24].copy_from_slice(&(value.len() as u32).to_le_bytes());
        slot[24..28].copy_from_slice(&checksum(8, LIVE, key, &value).to_le_bytes());
        slot[32..32 + key.len()].copy_from_slice(key);
        slot[SLOT_HEADER..SLOT_HEADER + value.len()].copy_from_slice(&value);
        assert!(matches!(view(&slot, &layout), SlotView::Live { .. }));
        // Every byte the checksum covers (not the hash, which only speeds up a look).
        let covered = (0..8).chain(16..28).chain(32..32 + key.len());
        for i in covered.chain(SLOT_HEADER..SLOT_HEADER + value.len()) {
            let mut torn = slot.clone();
            torn[i] ^= 0x40;
            assert!(
                !matches!(view(&torn, &layout), SlotView::Live { value: v, .. } if v == value),
                "byte {i} changed and the slot still reads as the value"
            );
        }
    }
}
