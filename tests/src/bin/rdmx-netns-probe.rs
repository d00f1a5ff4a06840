//! `rdmx-netns-probe`: reachability checks between test hosts without `ping`.
//!
//! * `rdmx-netns-probe echo [ADDR:PORT] [SECONDS]`: UDP echo server (default
//!   `0.0.0.0:17007`, 60 s); prints `ready ADDR:PORT` once bound.
//! * `rdmx-netns-probe ping ADDR:PORT [TIMEOUT_MS]`: exits 0 and prints the round-trip time
//!   when the echo server answers within the timeout (default 1000 ms), else exits 1.
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use rdmx_tests::probe::{ECHO_PORT, echo_server, ping};

fn usage() -> ExitCode {
    eprintln!("usage: rdmx-netns-probe echo [ADDR:PORT] [SECONDS] | ping ADDR:PORT [TIMEOUT_MS]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(0) {
        Some("echo") => {
            let bind = match arg(1).map(str::parse::<SocketAddr>) {
                None => SocketAddr::from((Ipv4Addr::UNSPECIFIED, ECHO_PORT)),
                Some(Ok(a)) => a,
                Some(Err(_)) => return usage(),
            };
            let Ok(secs) = arg(2).unwrap_or("60").parse::<u64>() else {
                return usage();
            };
            let ready = |a: SocketAddr| {
                println!("ready {a}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
            };
            match echo_server(bind, Duration::from_secs(secs), ready) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rdmx-netns-probe: echo on {bind}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("ping") => {
            let Some(Ok(target)) = arg(1).map(str::parse::<SocketAddr>) else {
                return usage();
            };
            let Ok(ms) = arg(2).unwrap_or("1000").parse::<u64>() else {
                return usage();
            };
            match ping(target, Duration::from_millis(ms)) {
                Ok(rtt) => {
                    println!("reply from {target} in {} us", rtt.as_micros());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("rdmx-netns-probe: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => usage(),
    }
}
