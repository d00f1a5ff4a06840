//! The line protocol of the `rdmx-netns-roles` programs, for the tests that drive them.
//!
//! The programs print one event per line on stdout: a keyword, then positional values or
//! `key=value` fields (`READY qpn=5`, `RECV 17 1700000000123456789`,
//! `RESULT got=200 seqs_ok=true`). [`wait_for_line`] waits (bounded) for a line of a running
//! [`Proc`]; [`Line`] splits one.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::Proc;

/// How often [`wait_for_line`] looks at the output.
const POLL: Duration = Duration::from_millis(5);

/// Nanoseconds since the Unix epoch (the clock the role programs stamp their lines with; the
/// hosts share the machine's clock).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One output line: a keyword and its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// The first word.
    pub keyword: &'a str,
    /// The words after the keyword.
    pub words: Vec<&'a str>,
}

impl<'a> Line<'a> {
    /// Splits `line` at whitespace; `None` for an empty line.
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut it = line.split_whitespace();
        let keyword = it.next()?;
        Some(Self {
            keyword,
            words: it.collect(),
        })
    }

    /// The value of field `key` (a word `key=value`).
    pub fn field(&self, key: &str) -> Option<&'a str> {
        self.words
            .iter()
            .find_map(|w| w.split_once('=').and_then(|(k, v)| (k == key).then_some(v)))
    }

    /// Field `key` parsed as a number.
    pub fn num(&self, key: &str) -> Option<u64> {
        self.field(key).and_then(|v| v.parse().ok())
    }

    /// Field `key` parsed as `true` / `false`.
    pub fn flag(&self, key: &str) -> Option<bool> {
        self.field(key).and_then(|v| v.parse().ok())
    }

    /// Positional word `i` (after the keyword) parsed as a number.
    pub fn pos(&self, i: usize) -> Option<u64> {
        self.words.get(i).and_then(|v| v.parse().ok())
    }
}

/// The lines of `out` whose keyword is `keyword`.
pub fn lines_with<'a>(out: &'a str, keyword: &str) -> Vec<Line<'a>> {
    out.lines()
        .filter_map(Line::parse)
        .filter(|l| l.keyword == keyword)
        .collect()
}

/// The last few lines of `s`, for failure messages.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Describes a process's state and output tail, for failure messages.
pub fn describe(p: &Proc) -> String {
    format!(
        "{} ({}):\n--- stdout (tail) ---\n{}\n--- stderr (tail) ---\n{}",
        p.command(),
        p.try_status()
            .map_or_else(|| "running".to_string(), |s| s.to_string()),
        tail(&p.stdout_now(), 15),
        tail(&p.stderr_now(), 15)
    )
}

/// Waits (at most `timeout`) until `p` has printed `count` complete lines with keyword
/// `keyword`, and returns the `count`-th one (1-based).
///
/// # Errors
/// A description of the process and its output when the lines do not come in time, or when
/// the process exits without printing them.
pub fn wait_for_nth(
    p: &Proc,
    keyword: &str,
    count: usize,
    timeout: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        // Read the status first: whatever was printed before the exit is then in the pipe.
        let exited = p.try_status().is_some();
        if exited {
            // Bounded: lets the pipe readers catch up with the last output.
            let _ = p.wait();
        }
        let out = p.stdout_now();
        // Only complete lines, unless the process is gone.
        let text = match out.rfind('\n') {
            _ if exited => out.as_str(),
            Some(i) => &out[..i],
            None => "",
        };
        if let Some(l) = text
            .lines()
            .filter(|l| Line::parse(l).is_some_and(|l| l.keyword == keyword))
            .nth(count.saturating_sub(1))
        {
            return Ok(l.to_string());
        }
        if exited {
            return Err(format!(
                "exited before printing {count} {keyword} line(s): {}",
                describe(p)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no {count} {keyword} line(s) within {timeout:?}: {}",
                describe(p)
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Waits (at most `timeout`) for the first line of `p` with keyword `keyword`.
///
/// # Errors
/// As [`wait_for_nth`].
pub fn wait_for_line(p: &Proc, keyword: &str, timeout: Duration) -> Result<String, String> {
    wait_for_nth(p, keyword, 1, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_into_keyword_fields_and_positions() {
        let l = Line::parse("RESULT got=200 seqs_ok=true  x").unwrap();
        assert_eq!(l.keyword, "RESULT");
        assert_eq!(l.num("got"), Some(200));
        assert_eq!(l.flag("seqs_ok"), Some(true));
        assert_eq!(l.field("x"), None);
        assert_eq!(l.field("nope"), None);
        let r = Line::parse("RECV 17 1700000000123456789").unwrap();
        assert_eq!(
            (r.pos(0), r.pos(1), r.pos(2)),
            (Some(17), Some(1_700_000_000_123_456_789), None)
        );
        assert!(Line::parse("   ").is_none());
        let out = "READY\nRECV 1 5\nRECV 2 6\nRESULT got=2\n";
        assert_eq!(lines_with(out, "RECV").len(), 2);
        assert_eq!(tail(out, 2), "RECV 2 6\nRESULT got=2");
    }

    #[test]
    fn waiting_for_lines_is_bounded() {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", "echo 'A 1'; echo 'B x=1'; echo 'A 2'; sleep 30"]);
        let p = crate::process::spawn(c, Duration::from_secs(20)).unwrap();
        let s = Duration::from_secs(10);
        assert_eq!(wait_for_line(&p, "B", s).unwrap(), "B x=1");
        assert_eq!(wait_for_nth(&p, "A", 2, s).unwrap(), "A 2");
        let e = wait_for_line(&p, "C", Duration::from_millis(100)).unwrap_err();
        assert!(e.contains("no 1 C line(s)") && e.contains("B x=1"), "{e}");
        p.kill();
        let mut c = std::process::Command::new("sh");
        c.args(["-c", "echo 'A 1'; exit 3"]);
        let p = crate::process::spawn(c, Duration::from_secs(20)).unwrap();
        let e = wait_for_nth(&p, "A", 2, s).unwrap_err();
        assert!(e.contains("exited before"), "{e}");
    }
}
