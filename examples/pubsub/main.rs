//! `rdmx-pubsub`: topics on reliable multicast groups.
//!
//! ```sh
//! cargo run --release --example pubsub -- sub prices            # prints what is published
//! cargo run --release --example pubsub -- pub prices one two    # publishes "one", "two"
//! cargo run --release --example pubsub -- bench [--pubs P] [--subs N] [--size BYTES] [--secs S]
//!     [--rate MSGS_PER_S] [--json] [--unreliable] [--procs | --netns]
//! ```
//!
//! `bench` runs `--pubs` publishers (default 1) and `--subs` subscribers (default 1) of one
//! group, each with a context of its own, and prints, with a live line on stderr once a
//! second while it runs, the messages each subscriber got per second (from its first message
//! to its last, every publisher's counted), the publish-to-deliver latency over all
//! subscribers (p50/p99/p99.9), the repairs asked for (the subscribers' NAKs; the publishers',
//! of each other's streams, apart) and served (the publishers' repairs), the members removed
//! (the publishers' `MemberRemoved` events) and the messages lost (0 in reliable mode);
//! `--json` prints one JSON object instead of the table.
//!
//! * By default every participant is a thread of this process, on the default soft device
//!   (`RDMX_DEVICE`, else loopback).
//! * `--procs`: every participant, publishers and subscribers alike, is a child process of
//!   this program (the hidden subcommands `bench-pub` and `bench-sub`), on the same device;
//!   this process only starts them, prints the live line from the counts they report and
//!   sums up their results.
//! * `--netns` (implies `--procs`; needs root): each child runs in a network namespace of its
//!   own (`rdmx-<pid>-ps-p<k>` for publisher k, `-s<k>` for subscriber k), its `eth0` a veth
//!   into one bridge (`br0`, multicast snooping off) in a namespace of its own
//!   (`rdmx-<pid>-ps-sw`), with the address `10.77.0.<n>/24` and a `224.0.0.0/4` route, and
//!   opens its context on `soft:10.77.0.<n>`. Nothing is created in the host's namespace, and
//!   every namespace (with its veths and the bridge) is deleted when the run ends, also on an
//!   error; a helper process (`bench-reap`, in a process group of its own) deletes them if
//!   this process dies first (Ctrl-C), and a later run deletes those of a dead run.
//!
//! Each publisher publishes its own numbered stream: a message is its sequence number (8
//! bytes), its send time (8 bytes, nanoseconds since the Unix epoch: every process of a host
//! and its namespaces share the clock) and filler up to `--size` (16 at least); after `--secs`
//! a last message with the sequence number `u64::MAX` marks the end, and the publisher waits
//! until every member has taken everything. Each subscriber checks, per publisher (by member
//! id), that the sequence numbers come in order without gaps; the messages lost are those
//! skipped and those after the last one received. Without `--rate` the publishers publish as
//! fast as the group takes (a throughput test: latency then includes the publisher's queue);
//! with it, each at that rate (a latency test). Publishers take (and drop) the other
//! publishers' messages: every member of a group receives every stream, and paces it.
//!
//! A child reports `READY <member id>` once it joined, `PROGRESS <count>` every 200 ms (the
//! messages it published or got), `ENDED` once it did its part (a publisher: every member
//! took everything; a subscriber: it has every end mark), and at its end one line
//! `RESULT <role> key=value ...`. It reads `GO` (publishers start) and `STOP` (leave the
//! group, report, exit: sent once every participant ended, so that none leaves while the
//! others still count on it) on its stdin, and stops when its stdin closes.

use std::error::Error as StdError;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdmx::{Context, Group, McastConfig, McastEvent};

/// The sequence number of a publisher's end mark (not counted as a message).
const END: u64 = u64::MAX;
/// Longest wait for the participants to join and hear each other, and for the members to
/// take a reliable publisher's last messages.
const SETTLE: Duration = Duration::from_secs(20);
/// How often a child process reports its count.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// Under `cargo test`, where the children are the test harness (which has no subcommands),
/// their arguments, one a line.
const CHILD_ENV: &str = "RDMX_PUBSUB_BENCH_CHILD";
/// Most publishers and subscribers of a run, in all (`--netns` numbers them in one /24).
const MAX_PARTICIPANTS: usize = 128;
/// Largest message (the groups' default `max_message`).
const MAX_SIZE: usize = 1 << 20;

const USAGE: &str = "usage: pubsub sub TOPIC | pub TOPIC [MESSAGE...] | bench [--pubs P] \
                     [--subs N] [--size BYTES] [--secs S] [--rate MSGS_PER_S] [--json] \
                     [--unreliable] [--procs | --netns]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pubsub: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn StdError>> {
    match args.first().map(String::as_str) {
        Some("sub") => sub(args.get(1).ok_or("sub TOPIC")?),
        Some("pub") => publish(args.get(1).ok_or("pub TOPIC [MESSAGE...]")?, &args[2..]),
        Some("bench") => {
            let o = BenchOptions::parse(&args[1..])?;
            let r = bench(&o, &Launcher::this_program()?)?;
            if o.json {
                println!("{}", r.json());
            } else {
                print!("{}", r.table());
            }
            Ok(())
        }
        Some(cmd @ ("bench-pub" | "bench-sub" | "bench-reap")) => {
            Ok(child_main(args).map_err(|e| format!("{cmd}: {e}"))?)
        }
        _ => Err(USAGE.into()),
    }
}

/// Prints every message of `topic`, and the group's events.
fn sub(topic: &str) -> Result<(), Box<dyn StdError>> {
    let ctx = Context::new()?;
    let g = ctx.join(topic)?;
    eprintln!("member {} of {topic}", g.member_id());
    loop {
        while let Some(e) = g.poll_event() {
            eprintln!("event: {e:?}");
        }
        match g.recv_timeout(Duration::from_millis(200)) {
            Ok((from, m)) => println!("{from}: {}", String::from_utf8_lossy(&m)),
            Err(rdmx::Error::Timeout(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Publishes `messages` (or stdin's lines) to `topic`, once the group has a member.
fn publish(topic: &str, messages: &[String]) -> Result<(), Box<dyn StdError>> {
    let ctx = Context::new()?;
    let g = ctx.join(topic)?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while g.receivers() == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let lines: Vec<String> = if messages.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<_, _>>()?
    } else {
        messages.to_vec()
    };
    for l in &lines {
        g.publish_timeout(l.as_bytes(), Duration::from_secs(10))?;
    }
    // Until every member has taken everything.
    g.flush_timeout(Duration::from_secs(10))?;
    Ok(())
}

mod children;
mod histogram;
mod netns;
mod options;
mod results;
mod roles;
mod run;
#[cfg(test)]
mod tests;

use children::*;
use histogram::*;
use netns::*;
use options::*;
use results::*;
use roles::*;
use run::*;
