//! TEMPORARY STUB.
#![allow(missing_docs, dead_code)]
#[derive(Debug)]
pub struct PcapWriter;
impl PcapWriter {
    pub fn create(_p: &std::path::Path) -> std::io::Result<Self> { Ok(Self) }
    pub fn write_frame(&mut self, _ts: std::time::SystemTime, _s: std::net::SocketAddr, _d: std::net::SocketAddr, _p: &[u8]) -> std::io::Result<()> { Ok(()) }
    pub fn flush(&mut self) -> std::io::Result<()> { Ok(()) }
}
