//! The input format of the stateful targets (a NIC, a UD session, a multicast member): a
//! sequence of records, each a control byte, a big-endian `u16` length and that many bytes
//! (one datagram). Parsing is lenient, so that every byte string is an input: a record cut
//! short takes what is left.

/// Most records an input is split into (longer inputs are cut).
pub(crate) const MAX_RECORDS: usize = 256;

/// One record: the control byte (what the target does around the datagram) and the
/// datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    /// Target-defined control bits.
    pub(crate) ctrl: u8,
    /// The datagram.
    pub(crate) data: &'a [u8],
}

/// Splits `input` into records (at most [`MAX_RECORDS`]).
pub(crate) fn parse(input: &[u8]) -> Vec<Record<'_>> {
    let mut out = Vec::new();
    let mut rest = input;
    while let Some((&ctrl, tail)) = rest.split_first() {
        if out.len() == MAX_RECORDS {
            break;
        }
        let len = match tail {
            [a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])),
            _ => 0,
        };
        let body = tail.get(2..).unwrap_or(&[]);
        let (data, next) = body.split_at(len.min(body.len()));
        out.push(Record { ctrl, data });
        rest = next;
    }
    out
}

/// Appends one record to `out` (a datagram longer than 65535 bytes is cut).
pub(crate) fn push(out: &mut Vec<u8>, ctrl: u8, data: &[u8]) {
    let data = &data[..data.len().min(usize::from(u16::MAX))];
    out.push(ctrl);
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

/// The records as one input.
pub(crate) fn encode<'a>(records: impl IntoIterator<Item = (u8, &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    for (ctrl, data) in records {
        push(&mut out, ctrl, data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_any_bytes_parse() {
        let bytes = encode([(1, &b"abc"[..]), (2, &b""[..]), (3, &b"x"[..])]);
        let recs = parse(&bytes);
        assert_eq!(recs.len(), 3);
        assert_eq!(
            recs[0],
            Record {
                ctrl: 1,
                data: b"abc"
            }
        );
        assert_eq!(recs[2].data, b"x");
        // Cut short: the last record takes what is left.
        let recs = parse(&bytes[..5]);
        assert_eq!(recs[0].data, b"ab");
        assert_eq!(parse(&[7]), vec![Record { ctrl: 7, data: &[] }]);
        assert!(parse(&[]).is_empty());
    }
}
