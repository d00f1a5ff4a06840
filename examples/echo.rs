//! Echo: the message API of `rdmx` in one process.
//!
//! A server context and a client context talk over the built-in soft provider (a userspace
//! RDMA NIC over UDP on loopback, so no RDMA hardware is needed). The server, in a thread,
//! accepts one endpoint and sends every message it receives back. The client:
//!
//! 1. sends messages whose sizes take each of the three send protocols (a small one goes
//!    *inline* in the work request, a few KiB go *eager* through a pooled buffer, 1 MiB goes
//!    by *rendezvous*: the receiver RDMA-reads it), then 1 MiB of its own memory with
//!    `send_shared`, which the peer reads in place (zero copy), and checks every echo byte
//!    for byte;
//! 2. sends a burst of small messages inside a send batch (`Context::batch`), where they
//!    are *packed* several to a frame, and checks that the echoes come back in order;
//! 3. closes the endpoint (`Endpoint::close`), which the server sees as an orderly
//!    disconnect after the last message.
//!
//! After each step it prints what the client context's counters (`Context::stats`) say
//! was sent. Every wait has a timeout.
//!
//! Run it with
//!
//! ```sh
//! cargo run --release --example echo
//! ```
//!
//! The protocol thresholds come from the environment as usual, e.g.
//! `RDMX_RNDV_THRESHOLD=2048 cargo run --release --example echo` sends the 4 KiB message by
//! rendezvous too.

use std::error::Error as StdError;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmx::{Context, DisconnectCause, Endpoint, Error, Stats};

/// The longest any single send or receive of this example may wait.
const WAIT: Duration = Duration::from_secs(10);

/// Small messages sent in the batch when run from the command line.
const BURST: usize = 1000;

fn main() -> Result<(), Box<dyn StdError>> {
    run(BURST)
}

/// Runs the whole example, with `burst` messages in the send batch.
fn run(burst: usize) -> Result<(), Box<dyn StdError>> {
    let started = Instant::now();

    // The server: a context of its own, listening on an ephemeral TCP port (the side
    // channel the two contexts use to exchange queue pair numbers and keys).
    let server_ctx = Context::builder().build()?;
    let listener = server_ctx.listen("127.0.0.1:0")?;
    let addr = listener.local_addr();
    let server = thread::spawn(move || -> rdmx::Result<u64> {
        let ep = listener.accept_timeout(WAIT)?;
        serve(&ep)
    });

    // The client.
    let ctx = Context::builder().build()?;
    let ep = ctx.connect(addr)?;
    println!(
        "connected to {addr} (endpoint {}): inline up to {} B, rendezvous from {} B",
        ep.id(),
        ctx.inline_max(),
        ctx.config().rndv_threshold,
    );

    // 1. One message per protocol, each echoed and compared.
    for (step, size) in [("small", 32), ("a few KiB", 4 << 10), ("1 MiB", 1 << 20)] {
        let data = pattern(size, size as u8);
        let before = ctx.stats();
        let t = Instant::now();
        ep.send_timeout(&data, WAIT)?;
        let echo = ep.recv_timeout(WAIT)?;
        let rtt = t.elapsed();
        same(&echo, &data, step)?;
        println!(
            "{step:>12}: {size:>8} B echoed intact in {:>9.1?}, sent as {}",
            rtt,
            sent_as(&before, &ctx.stats()),
        );
    }

    // 1 MiB of the application's own memory with `send_shared`: the server reads it
    // where it is, through a registration the context caches for the next send of the same
    // buffer (no copy on this side).
    let blob: Arc<[u8]> = pattern(1 << 20, 99).into();
    let before = ctx.stats();
    let t = Instant::now();
    ep.send_shared_timeout(Arc::clone(&blob), WAIT)?;
    let echo = ep.recv_timeout(WAIT)?;
    let rtt = t.elapsed();
    same(&echo, &blob, "send_shared")?;
    println!(
        "{:>12}: {:>8} B echoed intact in {:>9.1?}, sent as {}",
        "send_shared",
        blob.len(),
        rtt,
        sent_as(&before, &ctx.stats()),
    );
    drop(echo); // a received message holds its buffer until it is dropped

    // 2. A burst of 8-byte messages inside a send batch: they leave together, packed into
    // shared frames (one SEND, one credit and one receive buffer per frame). The server
    // answers each one separately, and the echoes come back in order.
    let before = ctx.stats();
    let server_before = server_ctx.stats();
    let t = Instant::now();
    {
        let _batch = ctx.batch();
        for i in 0..burst as u64 {
            ep.send_timeout(&i.to_le_bytes(), WAIT)?;
        }
    } // dropping the guard sends whatever the batch still holds
    for i in 0..burst as u64 {
        let echo = ep.recv_timeout(WAIT)?;
        if echo[..] != i.to_le_bytes() {
            return Err(format!("batch: echo {i} came back as {:?}", &echo[..]).into());
        }
    }
    let elapsed = t.elapsed();
    let after = ctx.stats();
    println!(
        "{:>12}: {burst} x 8 B echoed in order in {elapsed:.1?}, sent as {} \
         (server answered one by one: {})",
        "batch",
        sent_as(&before, &after),
        sent_as(&server_before, &server_ctx.stats()),
    );

    // 3. An orderly close: what was sent is delivered first, then the server's `recv`
    // reports `Disconnected(PeerClosed)`.
    ep.close()?;
    let echoed = server.join().map_err(|_| "the server thread panicked")??;
    let totals = ctx.stats();
    println!(
        "{:>12}: server echoed {echoed} messages; client totals: {} inline, {} eager, \
         {} rendezvous ({} zero-copy), {} packed in {} frames; {:.1?} in all",
        "closed",
        totals.sent_inline,
        totals.sent_eager,
        totals.sent_rndv,
        totals.sent_zero_copy,
        totals.sent_packed,
        totals.packed_frames,
        started.elapsed(),
    );
    Ok(())
}

/// The server's loop: send back whatever arrives until the client closes. Returns how many
/// messages it echoed.
fn serve(ep: &Endpoint) -> rdmx::Result<u64> {
    let mut echoed = 0;
    loop {
        match ep.recv_timeout(WAIT) {
            // A `Message` dereferences to its payload; `send` picks the protocol by size.
            Ok(msg) => ep.send_timeout(&msg, WAIT)?,
            Err(Error::Disconnected(DisconnectCause::PeerClosed)) => return Ok(echoed),
            Err(e) => return Err(e),
        }
        echoed += 1;
    }
}

/// `len` bytes of a pattern that depends on `seed` and on the position.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Checks that an echo is byte for byte what was sent.
fn same(echo: &[u8], sent: &[u8], step: &str) -> Result<(), String> {
    if echo.len() != sent.len() {
        return Err(format!(
            "{step}: sent {} bytes, {} came back",
            sent.len(),
            echo.len()
        ));
    }
    match echo.iter().zip(sent).position(|(a, b)| a != b) {
        Some(i) => Err(format!("{step}: the echo differs at byte {i}")),
        None => Ok(()),
    }
}

/// Which send protocols a context used between two readings of its counters.
fn sent_as(before: &Stats, after: &Stats) -> String {
    let counts = [
        ("inline", after.sent_inline - before.sent_inline),
        ("eager", after.sent_eager - before.sent_eager),
        ("rendezvous", after.sent_rndv - before.sent_rndv),
        (
            "of them zero-copy",
            after.sent_zero_copy - before.sent_zero_copy,
        ),
        ("packed", after.sent_packed - before.sent_packed),
        ("packed frames", after.packed_frames - before.packed_frames),
    ];
    let used: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{n} {name}"))
        .collect();
    if used.is_empty() {
        "nothing".into()
    } else {
        used.join(", ")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs() {
        super::run(64).unwrap();
    }
}
