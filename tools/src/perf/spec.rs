//! What a side of a test round needs: the buffer layout of its memory region and the sizes
//! of its queues.

use rdmx::verbs::ah::GRH_LEN;

use super::exchange::TestParams;
use super::{CLIENT_SEED, SERVER_SEED, TestKind, Transport};

/// Send / receive queue depth of the latency tests.
pub(crate) const LAT_DEPTH: u32 = 16;
/// UD send_bw: receives the client keeps posted for the server's credit messages.
pub(crate) const CREDIT_RX_DEPTH: u32 = 64;
/// UD send_bw: send queue depth of the server (it only sends credit messages).
pub(crate) const CREDIT_SQ_DEPTH: u32 = 64;

/// Where things are in a side's memory region (the same on both sides for a given size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Message size.
    pub(crate) size: usize,
    /// Offset of the buffer sends and writes come from, and reads and atomics target.
    pub(crate) tx_off: usize,
    /// Offset of the buffer receives, writes, read results and atomic results land in.
    pub(crate) rx_off: usize,
    /// Bytes in front of the received data: the GRH of UD receives, 0 otherwise.
    pub(crate) grh: usize,
    /// Length of the region.
    pub(crate) len: usize,
}

impl Layout {
    /// The layout for `size`-byte messages; UD receive buffers start with the GRH.
    pub(crate) fn new(size: u64, transport: Transport) -> Self {
        let size = size as usize;
        let grh = match transport {
            Transport::Rc => 0,
            Transport::Ud => GRH_LEN,
        };
        let tx_slot = size.next_multiple_of(64).max(64);
        let rx_slot = (grh + size).next_multiple_of(64).max(64);
        Self {
            size,
            tx_off: 0,
            rx_off: tx_slot,
            grh,
            len: tx_slot + rx_slot,
        }
    }

    /// Offset of the received data (after the GRH on UD).
    pub(crate) fn rx_data(&self) -> usize {
        self.rx_off + self.grh
    }
}

/// Which side of the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Runs the test and measures.
    Client,
    /// Answers.
    Server,
}

/// Resources a side needs for a test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpSpec {
    pub(crate) transport: Transport,
    pub(crate) size: u64,
    pub(crate) sq_depth: u32,
    pub(crate) rx_depth: u32,
    pub(crate) inline_size: u32,
    /// Pattern seed the transmit buffer is filled with (`None`: left zeroed).
    pub(crate) seed: Option<u8>,
    /// Every receive completion must carry exactly this many payload bytes (GRH excluded).
    pub(crate) recv_len: Option<u32>,
}

impl EpSpec {
    /// What `role` needs to run `p`.
    pub(crate) fn for_test(p: &TestParams, role: Role) -> Self {
        let client = role == Role::Client;
        let seed = Some(if client { CLIENT_SEED } else { SERVER_SEED });
        let mut s = Self {
            transport: p.transport,
            size: p.size,
            sq_depth: LAT_DEPTH,
            rx_depth: 0,
            inline_size: p.inline_size,
            seed,
            recv_len: None,
        };
        let ud = p.transport == Transport::Ud;
        match p.test {
            TestKind::SendLat => {
                s.rx_depth = LAT_DEPTH;
                s.recv_len = Some(p.size as u32);
            }
            TestKind::WriteLat => s.rx_depth = if p.mem_poll { 0 } else { LAT_DEPTH },
            TestKind::ReadLat => {}
            TestKind::AtomicLat => s.seed = None,
            TestKind::SendBw if client && ud => {
                // The server's credit messages carry no payload.
                s.sq_depth = p.tx_depth;
                s.rx_depth = CREDIT_RX_DEPTH;
                s.recv_len = Some(0);
            }
            TestKind::SendBw | TestKind::WriteBw | TestKind::ReadBw if client => {
                s.sq_depth = p.tx_depth;
            }
            TestKind::SendBw => {
                s.rx_depth = p.rx_depth;
                s.recv_len = Some(p.size as u32);
                if ud {
                    s.sq_depth = CREDIT_SQ_DEPTH;
                }
            }
            TestKind::WriteBw | TestKind::ReadBw => {}
        }
        if !client && p.test.is_one_sided() {
            s.sq_depth = 1;
        }
        s
    }
}
