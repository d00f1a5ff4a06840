//! TEMPORARY STUB (replaced by the real fault injector).
#![allow(missing_docs, dead_code)]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultConfig { pub seed: u64 }
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("x")]
pub struct FaultParseError;
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats { pub seen: u64 }
impl FaultConfig {
    pub fn from_env() -> Result<Option<Self>, FaultParseError> { Ok(None) }
    pub fn is_noop(&self) -> bool { true }
}
#[derive(Debug)]
pub struct FaultInjector<A> { q: Vec<(A, Vec<u8>)> }
impl<A: Clone> FaultInjector<A> {
    pub fn new(_c: FaultConfig) -> Self { Self { q: Vec::new() } }
    pub fn handle_frame(&mut self, _now: u64, src: A, f: &[u8]) { self.q.push((src, f.to_vec())) }
    pub fn poll_frame(&mut self, _now: u64) -> Option<(A, Vec<u8>)> { self.q.pop() }
    pub fn poll_timeout(&self) -> Option<u64> { None }
    pub fn stats(&self) -> FaultStats { FaultStats::default() }
}
