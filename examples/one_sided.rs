//! One-sided operations: RDMA WRITE, READ, fetch-and-add and compare-and-swap on memory
//! the peer registered, without the peer's CPU taking part.
//!
//! The server registers a region (`Context::register`), puts a greeting and a counter in
//! it, and advertises it to the client as a `RemoteRegion`: an address, a length and a
//! remote key, sent as an ordinary 20-byte message (`RemoteRegion::to_bytes`). Then it only
//! waits. The client, holding the `RemoteRegion`:
//!
//! * `read`s the greeting,
//! * `write`s a string and reads it back,
//! * runs `fetch_add` on the counter from several threads at once through the same
//!   endpoint, and checks that every thread saw a different old value and that no
//!   increment was lost,
//! * uses `compare_swap` as a try-lock on another word: taking a free lock succeeds,
//!   taking it again fails and reports the holder, releasing it succeeds.
//!
//! Finally it tells the server it is done; the server checks its own memory, which the
//! client changed without the server doing anything, and answers with what it found.
//!
//! Atomics work on 8-byte aligned words in the byte order of the host that owns the
//! memory (`MemoryRegion::read_u64` / `write_u64` on that side). One-sided operations
//! wait for their completion and have no timeout form: a peer that dies makes them fail
//! with `Disconnected` within the peer timeout (`RDMX_PEER_TIMEOUT_MS`).
//!
//! Run it with
//!
//! ```sh
//! cargo run --release --example one_sided
//! ```

use std::collections::HashSet;
use std::error::Error as StdError;
use std::thread;
use std::time::{Duration, Instant};

use rdmx::{Context, DisconnectCause, Endpoint, Error, LocalRegion, RemoteRegion};

/// The longest any single message wait of this example may take.
const WAIT: Duration = Duration::from_secs(10);

/// Where things are in the server's region.
const REGION_LEN: usize = 4096;
const GREETING_AT: u64 = 0;
const GREETING: &[u8] = b"hello from the server's memory";
const NOTE_AT: u64 = 256;
const NOTE: &[u8] = b"written by the client, with no help from the server";
const COUNTER_AT: u64 = 1024;
const COUNTER_START: u64 = 1000;
const LOCK_AT: u64 = 1032;

/// Threads and increments per thread when run from the command line.
const THREADS: u64 = 4;
const ADDS: u64 = 250;

fn main() -> Result<(), Box<dyn StdError>> {
    run(THREADS, ADDS)
}

/// Runs the example: `threads` client threads do `adds` fetch-and-adds each.
fn run(threads: u64, adds: u64) -> Result<(), Box<dyn StdError>> {
    let started = Instant::now();
    let server_ctx = Context::builder().build()?;
    let listener = server_ctx.listen("127.0.0.1:0")?;
    let addr = listener.local_addr();
    let expected_counter = COUNTER_START + threads * adds;
    let server = thread::spawn(move || -> rdmx::Result<String> {
        let ep = listener.accept_timeout(WAIT)?;
        let region = listener.context().register(REGION_LEN)?;
        serve(&ep, &region, expected_counter)
    });

    let ctx = Context::builder().build()?;
    let ep = ctx.connect(addr)?;

    // The region's description arrives as a message.
    let msg = ep.recv_timeout(WAIT)?;
    let remote = RemoteRegion::from_bytes(&msg).ok_or("the server sent no region")?;
    drop(msg);
    println!(
        "got a remote region: {} bytes at {:#x}, rkey {:#x}",
        remote.len, remote.addr, remote.rkey
    );

    // READ: bytes of the peer's memory into a pooled buffer of ours.
    let t = Instant::now();
    let greeting = ep.read(&remote, GREETING_AT, GREETING.len())?;
    if greeting[..] != *GREETING {
        return Err(format!("read {:?}", String::from_utf8_lossy(&greeting)).into());
    }
    println!(
        "read:          {:?} in {:.1?}",
        String::from_utf8_lossy(&greeting),
        t.elapsed()
    );

    // WRITE: it returns once the bytes are in the peer's memory; read them back.
    let t = Instant::now();
    ep.write(&remote, NOTE_AT, NOTE)?;
    let back = ep.read(&remote, NOTE_AT, NOTE.len())?;
    if back[..] != *NOTE {
        return Err("the written note did not read back".into());
    }
    println!(
        "write + read:  {} bytes at offset {NOTE_AT} read back intact in {:.1?}",
        NOTE.len(),
        t.elapsed()
    );

    // FETCH-AND-ADD from several threads through the same endpoint (an `Endpoint` is
    // `Sync`). Each call returns the word's value before its own add, so the old values
    // seen by all threads together are each value from the start up, exactly once.
    let t = Instant::now();
    let seen = thread::scope(|s| -> rdmx::Result<Vec<u64>> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> rdmx::Result<Vec<u64>> {
                    (0..adds)
                        .map(|_| ep.fetch_add(&remote, COUNTER_AT, 1))
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.join().expect("a fetch_add thread panicked")?);
        }
        Ok(all)
    })?;
    let distinct: HashSet<u64> = seen.iter().copied().collect();
    let want: HashSet<u64> = (COUNTER_START..expected_counter).collect();
    if distinct != want || seen.len() != want.len() {
        return Err("fetch_add: the old values were not each seen exactly once".into());
    }
    // An add of 0 reads the word atomically.
    let now = ep.fetch_add(&remote, COUNTER_AT, 0)?;
    if now != expected_counter {
        return Err(format!("fetch_add: the counter is {now}, not {expected_counter}").into());
    }
    println!(
        "fetch_add:     {threads} threads x {adds} adds took the counter from {COUNTER_START} \
         to {now}, every old value seen once, in {:.1?}",
        t.elapsed()
    );

    // COMPARE-AND-SWAP as a try-lock: 0 is free, anything else is the holder's id.
    let me = 7;
    let t = Instant::now();
    let old = ep.compare_swap(&remote, LOCK_AT, 0, me)?;
    if old != 0 {
        return Err(format!("compare_swap: the free lock was held by {old}").into());
    }
    let again = ep.compare_swap(&remote, LOCK_AT, 0, 8)?;
    if again != me {
        return Err(format!("compare_swap: a second taker found {again}, not {me}").into());
    }
    let released = ep.compare_swap(&remote, LOCK_AT, me, 0)?;
    if released != me {
        return Err(format!("compare_swap: releasing found {released}").into());
    }
    println!(
        "compare_swap:  took the free lock (old 0), a second try failed (holder {again}), \
         released it, in {:.1?}",
        t.elapsed()
    );

    // Tell the server we are done; it checks its memory and answers.
    ep.send_timeout(b"done", WAIT)?;
    let verdict = ep.recv_timeout(WAIT)?;
    println!("server says:   {}", String::from_utf8_lossy(&verdict));
    drop(verdict);
    ep.close()?;
    let outcome = server.join().map_err(|_| "the server thread panicked")??;
    if !outcome.starts_with("ok") {
        return Err(format!("the server found: {outcome}").into());
    }
    println!("done in {:.1?}", started.elapsed());
    Ok(())
}

/// The server: fills the region, advertises it, waits for "done", and checks what the
/// client left in its memory. Returns its verdict (also sent to the client).
fn serve(ep: &Endpoint, region: &LocalRegion, expected_counter: u64) -> rdmx::Result<String> {
    // The region is zeroed; the server writes into it through `memory()` (copies, since
    // the peer may access it at any time).
    let mem = region.memory();
    mem.write(GREETING_AT as usize, GREETING)?;
    mem.write_u64(COUNTER_AT as usize, COUNTER_START)?;
    ep.send_timeout(&region.remote().to_bytes(), WAIT)?;

    let done = ep.recv_timeout(WAIT)?;
    if &done[..] != b"done" {
        return Err(Error::Protocol("expected \"done\"".into()));
    }
    drop(done);
    let note = mem.to_vec(NOTE_AT as usize, NOTE.len())?;
    let counter = mem.read_u64(COUNTER_AT as usize)?;
    let lock = mem.read_u64(LOCK_AT as usize)?;
    let verdict = if note == NOTE && counter == expected_counter && lock == 0 {
        format!("ok: the note is there, the counter is {counter}, the lock is free")
    } else {
        format!(
            "wrong: note {:?}, counter {counter} (expected {expected_counter}), lock {lock}",
            String::from_utf8_lossy(&note)
        )
    };
    ep.send_timeout(verdict.as_bytes(), WAIT)?;
    // Keep the region registered until the client has closed.
    match ep.recv_timeout(WAIT) {
        Err(Error::Disconnected(DisconnectCause::PeerClosed)) => Ok(verdict),
        Err(e) => Err(e),
        Ok(_) => Err(Error::Protocol("a message after \"done\"".into())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs() {
        super::run(2, 20).unwrap();
    }
}
