//! Many clients, one server thread: receiving from every endpoint of a context with
//! `Context::recv`.
//!
//! The server accepts one endpoint per client, keeps them in a map from `Endpoint::id` to
//! `Endpoint`, and serves all of them from a single loop: `Context::recv_timeout` hands it
//! the next message of whichever endpoint has one (busy endpoints take turns), and
//! `Message::endpoint` says which endpoint to answer. Disconnects are not errors of that
//! call but events (`Context::poll_event`): the server drops a client's endpoint when its
//! `Disconnected` event comes, which is after the client's last message, and stops when
//! every client is gone.
//!
//! The clients are threads of one process, so they share one client context (a context is
//! cheap to clone and safe to use from several threads), each with an endpoint of its own.
//! Each does a number of request/response round trips and checks every answer.
//!
//! Run it with
//!
//! ```sh
//! cargo run --release --example many_clients            # 8 clients
//! cargo run --release --example many_clients -- 32      # 32 clients
//! cargo run --release --example many_clients -- 32 500  # 32 clients, 500 round trips each
//! ```

use std::collections::HashMap;
use std::error::Error as StdError;
use std::thread;
use std::time::{Duration, Instant};

use rdmx::{Context, DisconnectCause, Endpoint, Error, Event};

/// The longest any single wait of this example may take.
const WAIT: Duration = Duration::from_secs(10);

/// How long the server's receive waits before it looks at events again.
const SERVER_TICK: Duration = Duration::from_millis(100);

/// Clients and round trips per client when no arguments are given.
const DEFAULT_CLIENTS: usize = 8;
const DEFAULT_ROUNDS: u32 = 2000;

fn main() -> Result<(), Box<dyn StdError>> {
    let mut args = std::env::args().skip(1);
    let clients = match args.next() {
        Some(a) => a
            .parse()
            .map_err(|e| format!("the number of clients {a:?}: {e}"))?,
        None => DEFAULT_CLIENTS,
    };
    let rounds = match args.next() {
        Some(a) => a
            .parse()
            .map_err(|e| format!("the number of round trips {a:?}: {e}"))?,
        None => DEFAULT_ROUNDS,
    };
    run(clients, rounds)
}

/// A request: which client sent it, and its sequence number.
fn request(client: u32, seq: u32) -> [u8; 8] {
    let mut r = [0u8; 8];
    r[..4].copy_from_slice(&client.to_le_bytes());
    r[4..].copy_from_slice(&seq.to_le_bytes());
    r
}

/// The server's answer to a request: the request, followed by the number of requests this
/// endpoint had sent before it (as the server counted them).
fn answer(req: &[u8], served_before: u64) -> Vec<u8> {
    let mut a = req.to_vec();
    a.extend_from_slice(&served_before.to_le_bytes());
    a
}

/// Runs `clients` client threads of `rounds` round trips each against one server thread.
fn run(clients: usize, rounds: u32) -> Result<(), Box<dyn StdError>> {
    if clients == 0 || clients > 10_000 {
        return Err(format!("{clients} clients: choose between 1 and 10000").into());
    }
    let server_ctx = Context::builder().build()?;
    let listener = server_ctx.listen("127.0.0.1:0")?;
    let addr = listener.local_addr();
    let started = Instant::now();

    let server = thread::spawn(move || -> rdmx::Result<u64> {
        // Accept everyone first (as README's snippet does); clients that connected early
        // simply wait for their first answer meanwhile.
        let mut peers: HashMap<u64, Endpoint> = HashMap::new();
        for _ in 0..clients {
            let ep = listener.accept_timeout(WAIT)?;
            peers.insert(ep.id(), ep);
        }
        let ctx = listener.context();
        let mut served: HashMap<u64, u64> = HashMap::new();
        let mut total = 0;
        let mut idle_since = Instant::now();
        while !peers.is_empty() {
            match ctx.recv_timeout(SERVER_TICK) {
                Ok(msg) => {
                    // Answer the endpoint that spoke. A message of an endpoint already
                    // dropped is not delivered, so the lookup only fails on a bug.
                    let Some(ep) = peers.get(&msg.endpoint()) else {
                        return Err(Error::Protocol(format!(
                            "a message from unknown endpoint {}",
                            msg.endpoint()
                        )));
                    };
                    let count = served.entry(msg.endpoint()).or_default();
                    ep.send_timeout(&answer(&msg, *count), WAIT)?;
                    *count += 1;
                    total += 1;
                    idle_since = Instant::now();
                }
                Err(Error::Timeout(_)) if idle_since.elapsed() < WAIT => {}
                Err(e) => return Err(e),
            }
            // Endpoints that went down: the peer closed (reported after its last message
            // was taken), or it failed.
            while let Some(event) = ctx.poll_event() {
                if let Event::Disconnected { endpoint, cause } = event {
                    peers.remove(&endpoint);
                    if !matches!(cause, DisconnectCause::PeerClosed) {
                        eprintln!("server: endpoint {endpoint} lost: {cause}");
                    }
                }
            }
        }
        Ok(total)
    });

    // The clients: one shared context, one endpoint and one thread each.
    let ctx = Context::builder().build()?;
    let handles: Vec<_> = (0..clients as u32)
        .map(|client| {
            let ctx = ctx.clone();
            thread::spawn(move || client_thread(&ctx, addr, client, rounds))
        })
        .collect();
    let mut done = 0u64;
    let mut failures = Vec::new();
    for (client, handle) in handles.into_iter().enumerate() {
        match handle.join() {
            Ok(Ok(elapsed)) => {
                done += u64::from(rounds);
                println!(
                    "client {client:>3}: {rounds} round trips in {elapsed:>9.1?} ({:.1?} each)",
                    elapsed / rounds.max(1)
                );
            }
            Ok(Err(e)) => failures.push(format!("client {client}: {e}")),
            Err(_) => failures.push(format!("client {client}: the thread panicked")),
        }
    }
    let served = server.join().map_err(|_| "the server thread panicked")??;
    let elapsed = started.elapsed();
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    if served != done {
        return Err(format!("the server answered {served} requests, clients saw {done}").into());
    }
    println!(
        "total: {clients} clients, {done} round trips in {elapsed:.1?} ({:.0} round trips/s), \
         all answered by one server thread",
        done as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// One client: connects, does `rounds` round trips checking each answer, and closes.
/// Returns the time the round trips took.
fn client_thread(
    ctx: &Context,
    addr: std::net::SocketAddr,
    client: u32,
    rounds: u32,
) -> rdmx::Result<Duration> {
    let ep = ctx.connect(addr)?;
    let t = Instant::now();
    for seq in 0..rounds {
        let req = request(client, seq);
        ep.send_timeout(&req, WAIT)?;
        let reply = ep.recv_timeout(WAIT)?;
        if reply[..] != answer(&req, u64::from(seq))[..] {
            return Err(Error::Protocol(format!(
                "client {client}, request {seq}: unexpected answer {:?}",
                &reply[..]
            )));
        }
    }
    let elapsed = t.elapsed();
    ep.close()?;
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs() {
        super::run(3, 50).unwrap();
    }
}
