//! Reachability probes without `ping`: a UDP echo server and a pinger, run inside the hosts as
//! the `rdmx-netns-probe` binary (`echo` and `ping` subcommands).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// UDP port the echo server listens on by default.
pub const ECHO_PORT: u16 = 17007;

/// Binds `bind` and calls `ready` with the bound address, then echoes every datagram received
/// back to its sender, for `lifetime`.
///
/// # Errors
/// When the socket cannot be bound or used.
pub fn echo_server(
    bind: SocketAddr,
    lifetime: Duration,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let sock = UdpSocket::bind(bind)?;
    ready(sock.local_addr()?);
    let end = Instant::now() + lifetime;
    let mut buf = [0u8; 2048];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        sock.set_read_timeout(Some(left.min(Duration::from_millis(500))))?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                let _ = sock.send_to(&buf[..n], from);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Sends a probe to `target` every 100 ms until the same bytes come back or `timeout`
/// passes; returns the round-trip time of the answered probe.
///
/// # Errors
/// A description of the failure ("no reply ...", or a socket error).
pub fn ping(target: SocketAddr, timeout: Duration) -> Result<Duration, String> {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| format!("bind: {e}"))?;
    let end = Instant::now() + timeout;
    let mut buf = [0u8; 2048];
    let mut last_err = None;
    for seq in 0u64.. {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let msg = format!("rdmx-probe {} {seq}", std::process::id());
        let sent = Instant::now();
        if let Err(e) = sock.send_to(msg.as_bytes(), target) {
            // E.g. ENETUNREACH while a link is down: keep trying until the deadline.
            last_err = Some(e.to_string());
        }
        let round_end = (sent + Duration::from_millis(100)).min(end);
        while let Some(left) = round_end.checked_duration_since(Instant::now()) {
            if left.is_zero() {
                break;
            }
            sock.set_read_timeout(Some(left))
                .map_err(|e| format!("set_read_timeout: {e}"))?;
            match sock.recv_from(&mut buf) {
                Ok((n, from)) if from == target && &buf[..n] == msg.as_bytes() => {
                    return Ok(sent.elapsed());
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    last_err = Some(e.to_string());
                    // A connection-refused style error: wait for the round's end anyway.
                    std::thread::sleep(left.min(Duration::from_millis(10)));
                }
            }
        }
    }
    Err(match last_err {
        Some(e) => format!("no reply from {target} within {timeout:?} (last error: {e})"),
        None => format!("no reply from {target} within {timeout:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_gets_its_echo_on_loopback() {
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            echo_server(
                (Ipv4Addr::LOCALHOST, 0).into(),
                Duration::from_secs(3),
                |a| {
                    let _ = tx.send(a);
                },
            )
        });
        let addr = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(ping(addr, Duration::from_secs(2)).is_ok());
        server.join().unwrap().unwrap();
        // Nobody listens any more.
        assert!(ping(addr, Duration::from_millis(250)).is_err());
    }
}
