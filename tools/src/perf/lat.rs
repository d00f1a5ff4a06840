//! The latency tests: ping-pong (send_lat, write_lat) and round trips (read_lat,
//! atomic_lat). The client times every iteration with `Instant`; the server echoes.

use std::time::{Duration, Instant};

use super::TestKind;
use super::endpoint::{Endpoint, Op};
use super::exchange::TestParams;
use super::report::Progress;
use crate::error::{Error, Result, ResultExt};

/// What the client measured.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    /// Round-trip time of every measured iteration, in nanoseconds (latency tests).
    pub(crate) rtt_ns: Vec<u64>,
    /// Wall time of the measured iterations.
    pub(crate) elapsed: Duration,
    /// UD send_bw: the server's receive count (credited) when the measurement started.
    pub(crate) ud_base: u64,
}

/// The value write_lat puts in the last byte at iteration `i` (never 0, never the value of
/// the iteration before).
pub(crate) fn counter(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Send,
    WriteMem,
    WriteImm,
    Read,
    Atomic,
}

fn mode(p: &TestParams) -> Mode {
    match p.test {
        TestKind::WriteLat if p.mem_poll => Mode::WriteMem,
        TestKind::WriteLat => Mode::WriteImm,
        TestKind::ReadLat => Mode::Read,
        TestKind::AtomicLat => Mode::Atomic,
        _ => Mode::Send,
    }
}

/// Offsets of the last byte of the transmit and receive buffers.
fn last_bytes(ep: &Endpoint) -> (usize, usize) {
    let l = ep.layout();
    (l.tx_off + l.size - 1, l.rx_off + l.size - 1)
}

/// Waits for the peer's message number `i` (a receive completion) and checks its immediate.
/// A timeout names the message (over UD a lost datagram ends the test that way).
fn wait_message(ep: &mut Endpoint, i: u64, imm: bool, what: &str) -> Result<()> {
    let want = i + 1;
    ep.wait_until(what, |e| Ok(e.recvs_done >= want))
        .map_err(|e| {
            let hint = if ep.is_ud() && e.to_string().starts_with("timed out") {
                "; UD does not retransmit, so a lost datagram ends the test"
            } else {
                ""
            };
            Error::msg(format!(
                "message {i} (counting from 0, warm-up included): {e}{hint}"
            ))
        })?;
    if imm && ep.last_recv.imm() != Some(i as u32) {
        return Err(Error::msg(format!(
            "{what}: immediate data {:?}, expected {i}",
            ep.last_recv.imm()
        )));
    }
    Ok(())
}

/// Runs the client side; returns the round-trip times.
pub(crate) fn client(
    ep: &mut Endpoint,
    p: &TestParams,
    progress: &mut Progress,
) -> Result<Measured> {
    let mode = mode(p);
    if mode == Mode::WriteMem {
        // Nothing completes on the receive side: spin on memory and drive the NIC meanwhile.
        ep.set_busy(true);
    }
    let (tx_last, rx_last) = last_bytes(ep);
    let rx_off = ep.layout().rx_off;
    let total = p.total();
    let mut rtt = Vec::with_capacity(p.iters.min(1 << 24) as usize);
    let mut start = Instant::now();
    for i in 0..total {
        if i == p.warmup {
            start = Instant::now();
        }
        let t0 = Instant::now();
        match mode {
            Mode::Send => {
                ep.post_one(Op::Send)?;
                wait_message(ep, i, false, "the server's reply")?;
            }
            Mode::WriteImm => {
                ep.post_one(Op::WriteImm(i as u32))?;
                wait_message(ep, i, true, "the server's RDMA write with immediate")?;
            }
            Mode::WriteMem => {
                let v = counter(i);
                ep.mr()
                    .write(tx_last, &[v])
                    .ctx("setting the iteration byte")?;
                ep.post_one(Op::Write)?;
                ep.wait_until("the server's RDMA write", |e| Ok(e.byte(rx_last)? == v))?;
            }
            Mode::Read | Mode::Atomic => {
                ep.post_one(if mode == Mode::Read {
                    Op::Read
                } else {
                    Op::FetchAdd
                })?;
                let want = ep.sends_posted;
                ep.wait_until("the completion", |e| Ok(e.sends_done >= want))?;
                if mode == Mode::Atomic {
                    let old = ep.mr().read_u64(rx_off).ctx("reading the fetched value")?;
                    if old != i {
                        return Err(Error::msg(format!(
                            "fetch-and-add {i} returned {old}, expected {i}"
                        )));
                    }
                }
            }
        }
        let t = t0.elapsed();
        if i >= p.warmup {
            rtt.push(t.as_nanos() as u64);
        }
        progress.update(i + 1);
    }
    let elapsed = start.elapsed();
    ep.drain_sends()?;
    Ok(Measured {
        rtt_ns: rtt,
        elapsed,
        ud_base: 0,
    })
}

/// Runs the server side of send_lat / write_lat (echo every message); returns the number of
/// iterations served.
pub(crate) fn server(ep: &mut Endpoint, p: &TestParams) -> Result<u64> {
    let mode = mode(p);
    if mode == Mode::WriteMem {
        ep.set_busy(true);
    }
    let (tx_last, rx_last) = last_bytes(ep);
    for i in 0..p.total() {
        match mode {
            Mode::WriteMem => {
                let v = counter(i);
                ep.wait_until("the client's RDMA write", |e| Ok(e.byte(rx_last)? == v))?;
                ep.mr()
                    .write(tx_last, &[v])
                    .ctx("setting the iteration byte")?;
                ep.post_one(Op::Write)?;
            }
            Mode::WriteImm => {
                wait_message(ep, i, true, "the client's RDMA write with immediate")?;
                ep.post_one(Op::WriteImm(i as u32))?;
            }
            Mode::Send => {
                wait_message(ep, i, false, "the client's message")?;
                ep.post_one(Op::Send)?;
            }
            Mode::Read | Mode::Atomic => {
                return Err(Error::msg("one-sided tests have no server loop"));
            }
        }
    }
    ep.drain_sends()?;
    Ok(p.total())
}
