//! The bandwidth tests: the client keeps up to `tx_depth` work requests in flight and
//! signals one in every few; for send_bw the server keeps receives posted and counts.

use std::time::Instant;

use super::TestKind;
use super::endpoint::{Endpoint, Op};
use super::exchange::TestParams;
use super::lat::Measured;
use super::report::Progress;
use crate::error::Result;

/// Runs the client side: warm-up, then the measured stream.
pub(crate) fn client(
    ep: &mut Endpoint,
    p: &TestParams,
    progress: &mut Progress,
) -> Result<Measured> {
    let op = match p.test {
        TestKind::SendBw => Op::Send,
        TestKind::WriteBw => Op::Write,
        _ => Op::Read,
    };
    let depth = u64::from(p.tx_depth);
    // Unsignaled work requests hold their send-queue slot until a later signaled one
    // completes, so at least one in every `depth` must be signaled.
    let sig_every = (depth / 4).clamp(1, 64);
    stream(ep, op, p.warmup, depth, sig_every, None)?;
    let t0 = Instant::now();
    stream(ep, op, p.iters, depth, sig_every, Some(progress))?;
    Ok(Measured {
        rtt_ns: Vec::new(),
        elapsed: t0.elapsed(),
    })
}

fn stream(
    ep: &mut Endpoint,
    op: Op,
    count: u64,
    depth: u64,
    sig_every: u64,
    mut progress: Option<&mut Progress>,
) -> Result<()> {
    let base = ep.sends_posted;
    let end = base + count;
    while ep.sends_done < end {
        let outstanding = ep.sends_posted - ep.sends_done;
        let room = depth.saturating_sub(outstanding).min(end - ep.sends_posted);
        if room > 0 {
            ep.post(op, room, |id| {
                id + 1 == end || (id + 1 - base) % sig_every == 0
            })?;
        }
        let before = ep.sends_done;
        ep.wait_until("send completions", |e| Ok(e.sends_done > before))?;
        if let Some(p) = progress.as_deref_mut() {
            p.update(ep.sends_done - base);
        }
    }
    Ok(())
}

/// The server side of send_bw: waits for every message (receives are reposted as they
/// complete); returns how many arrived.
pub(crate) fn server_send(ep: &mut Endpoint, p: &TestParams) -> Result<u64> {
    let total = p.total();
    ep.wait_until("the client's messages", |e| Ok(e.recvs_done >= total))?;
    Ok(ep.recvs_done)
}
