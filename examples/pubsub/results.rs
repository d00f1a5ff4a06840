//! The participants' results and how they travel.

use super::*;

/// What a subscriber saw of one publisher's stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamSeen {
    pub(crate) publisher: u32,
    pub(crate) got: u64,
    /// The sequence number expected next (one past the highest received).
    pub(crate) next: u64,
    /// Messages skipped (the sequence number jumped).
    pub(crate) gaps: u64,
    /// Messages out of order or malformed (never expected).
    pub(crate) out_of_order: u64,
    pub(crate) ended: bool,
}

/// What a subscriber saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SubResult {
    pub(crate) got: u64,
    pub(crate) first_ns: u64,
    pub(crate) last_ns: u64,
    pub(crate) streams: Vec<StreamSeen>,
    pub(crate) lat: Histogram,
    pub(crate) naks_sent: u64,
}

impl SubResult {
    /// Messages per second, first to last (over `secs` when there are not two).
    pub(crate) fn rate(&self, secs: f64) -> f64 {
        let span = self.last_ns.saturating_sub(self.first_ns);
        if self.got > 1 && span > 0 {
            (self.got - 1) as f64 * 1e9 / span as f64
        } else {
            self.got as f64 / secs.max(1e-9)
        }
    }
}

/// What a publisher did.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PubResult {
    pub(crate) member: u32,
    pub(crate) published: u64,
    pub(crate) repairs_sent: u64,
    /// Repairs it asked for of the other publishers' streams.
    pub(crate) naks_sent: u64,
    /// `MemberRemoved` events.
    pub(crate) removed: u64,
}

/// A participant's result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Pub(PubResult),
    Sub(SubResult),
}

/// The `key=value` fields of a result line.
pub(crate) struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    pub(crate) fn new(s: &'a str) -> Self {
        Self(
            s.split_whitespace()
                .filter_map(|t| t.split_once('='))
                .collect(),
        )
    }

    pub(crate) fn get(&self, key: &str) -> Result<&'a str, String> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("no {key} in the result"))
    }

    pub(crate) fn num<T: FromStr>(&self, key: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        number(key, self.get(key)?)
    }
}

impl Outcome {
    /// One line: the role, then `key=value` fields.
    pub(crate) fn encode(&self) -> String {
        match self {
            Self::Pub(p) => format!(
                "pub member={} published={} repairs_sent={} naks_sent={} removed={}",
                p.member, p.published, p.repairs_sent, p.naks_sent, p.removed
            ),
            Self::Sub(s) => {
                let streams: Vec<String> = s
                    .streams
                    .iter()
                    .map(|x| {
                        format!(
                            "{}:{}:{}:{}:{}:{}",
                            x.publisher,
                            x.got,
                            x.next,
                            x.gaps,
                            x.out_of_order,
                            u8::from(x.ended)
                        )
                    })
                    .collect();
                format!(
                    "sub got={} first_ns={} last_ns={} naks_sent={} streams={} lat={}",
                    s.got,
                    s.first_ns,
                    s.last_ns,
                    s.naks_sent,
                    streams.join(","),
                    s.lat.encode()
                )
            }
        }
    }

    pub(crate) fn decode(line: &str) -> Result<Self, String> {
        let (role, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let f = Fields::new(rest);
        match role {
            "pub" => Ok(Self::Pub(PubResult {
                member: f.num("member")?,
                published: f.num("published")?,
                repairs_sent: f.num("repairs_sent")?,
                naks_sent: f.num("naks_sent")?,
                removed: f.num("removed")?,
            })),
            "sub" => {
                let mut streams = Vec::new();
                for s in f.get("streams")?.split(',').filter(|s| !s.is_empty()) {
                    let v: Vec<u64> = s
                        .split(':')
                        .map(|x| number("stream", x))
                        .collect::<Result<_, _>>()?;
                    let [publisher, got, next, gaps, out_of_order, ended] = v[..] else {
                        return Err(format!("stream {s:?}"));
                    };
                    streams.push(StreamSeen {
                        publisher: u32::try_from(publisher).map_err(|e| e.to_string())?,
                        got,
                        next,
                        gaps,
                        out_of_order,
                        ended: ended != 0,
                    });
                }
                Ok(Self::Sub(SubResult {
                    got: f.num("got")?,
                    first_ns: f.num("first_ns")?,
                    last_ns: f.num("last_ns")?,
                    naks_sent: f.num("naks_sent")?,
                    streams,
                    lat: Histogram::decode(f.get("lat")?)?,
                }))
            }
            other => Err(format!("a result of role {other:?}")),
        }
    }
}
