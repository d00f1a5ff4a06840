//! Packet sequence numbers: 32 bits that wrap, compared by their distance (a window is
//! always far below 2^31 packets).

/// A packet sequence number of one direction of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// The next number.
    pub fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }

    /// `self + n`.
    pub fn plus(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n))
    }

    /// How far `self` is after `earlier` (negative when it is before).
    pub fn since(self, earlier: Self) -> i64 {
        i64::from(self.0.wrapping_sub(earlier.0) as i32)
    }

    /// Strictly before `other`.
    pub fn before(self, other: Self) -> bool {
        self.since(other) < 0
    }

    /// In `[from, to)`.
    pub fn within(self, from: Self, to: Self) -> bool {
        !self.before(from) && self.before(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_survive_the_wrap() {
        let a = Seq(u32::MAX - 1);
        let b = a.plus(3);
        assert_eq!(b, Seq(1));
        assert!(a.before(b));
        assert!(!b.before(a));
        assert_eq!(b.since(a), 3);
        assert_eq!(a.since(b), -3);
        assert!(Seq(0).within(a, b));
        assert!(!b.within(a, b));
        assert!(a.within(a, b));
    }
}
