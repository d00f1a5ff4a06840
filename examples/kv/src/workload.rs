//! YCSB-style workloads: the mix of reads and updates (A 50/50, B 95/5, C read-only),
//! which keys (uniform, or Zipf-distributed with YCSB's generator and its hot keys
//! scattered), and what keys and values look like.

/// The read/update mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// 50 % reads, 50 % updates.
    A,
    /// 95 % reads, 5 % updates.
    B,
    /// Reads only.
    C,
}

impl Mix {
    /// The share of reads.
    pub fn read_fraction(self) -> f64 {
        match self {
            Self::A => 0.5,
            Self::B => 0.95,
            Self::C => 1.0,
        }
    }

    /// Its letter.
    pub fn name(self) -> &'static str {
        match self {
            Self::A => "A",
            Self::B => "B",
            Self::C => "C",
        }
    }
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    /// Every key alike.
    Uniform,
    /// Zipf with this exponent (YCSB: 0.99).
    Zipf(f64),
}

/// A small fast generator (xorshift64*), one per client.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (0 is made 1).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Draws key numbers in `0..n`.
#[derive(Debug, Clone)]
pub struct KeyGen {
    n: u64,
    zipf: Option<Zipf>,
}

#[derive(Debug, Clone)]
struct Zipf {
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl KeyGen {
    /// Keys `0..n` drawn by `dist`.
    pub fn new(n: u64, dist: Dist) -> Self {
        let n = n.max(1);
        let zipf = match dist {
            Dist::Uniform => None,
            Dist::Zipf(theta) => {
                let zetan = zeta(n, theta);
                let zeta2 = zeta(2, theta);
                Some(Zipf {
                    theta,
                    alpha: 1.0 / (1.0 - theta),
                    zetan,
                    eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
                })
            }
        };
        Self { n, zipf }
    }

    /// The next key number.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let Some(z) = &self.zipf else {
            return rng.next_u64() % self.n;
        };
        let u = rng.unit();
        let uz = u * z.zetan;
        let rank = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(z.theta) {
            1
        } else {
            ((self.n as f64) * (z.eta * u - z.eta + 1.0).powf(z.alpha)) as u64
        };
        // The hot ranks scattered over the key space, as YCSB does.
        scatter(rank.min(self.n - 1)) % self.n
    }
}

fn scatter(x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in x.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Key `i`'s bytes (16).
pub fn key(i: u64) -> Vec<u8> {
    format!("user{i:012}").into_bytes()
}

/// A value of `len` bytes (at least 16) for key `i`, version `v`: the version, the key
/// number, then bytes that depend on both (so a value mixed from two writes shows).
pub fn value(i: u64, v: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len.max(16)];
    b[..8].copy_from_slice(&v.to_le_bytes());
    b[8..16].copy_from_slice(&i.to_le_bytes());
    for (j, x) in b.iter_mut().enumerate().skip(16) {
        *x = (v
            .wrapping_mul(131)
            .wrapping_add(i * 7)
            .wrapping_add(j as u64)) as u8;
    }
    b
}

/// The (key number, version) of value `b`, if it is whole and one [`value`] made.
pub fn check_value(b: &[u8]) -> Option<(u64, u64)> {
    let v = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let i = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
    (value(i, v, b.len()) == b).then_some((i, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let g = KeyGen::new(10_000, Dist::Zipf(0.99));
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; 10_000];
        for _ in 0..200_000 {
            counts[g.next(&mut rng) as usize] += 1;
        }
        let mut c = counts.clone();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let top10: u32 = c[..10].iter().sum();
        // With theta 0.99 the 10 hottest of 10,000 keys take about a quarter of the draws.
        assert!(top10 > 30_000, "top 10 keys got {top10} of 200,000");
        let u = KeyGen::new(10_000, Dist::Uniform);
        let mut c = vec![0u32; 10_000];
        for _ in 0..200_000 {
            c[u.next(&mut rng) as usize] += 1;
        }
        assert!(c.iter().all(|&x| x < 80), "uniform draws too skewed");
    }

    #[test]
    fn values_check_and_mixed_values_do_not() {
        let a = value(3, 9, 64);
        assert_eq!(check_value(&a), Some((3, 9)));
        let b = value(3, 10, 64);
        let mut mixed = a.clone();
        mixed[32..].copy_from_slice(&b[32..]);
        assert_eq!(check_value(&mixed), None);
    }
}
