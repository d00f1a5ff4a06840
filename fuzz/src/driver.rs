//! The run loop: generates inputs (the corpus as it is, then mutations of it and random
//! bytes), runs each under `catch_unwind` with the allocation meter armed, and stops at the
//! first finding with what it takes to replay it.

use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::alloc;
use crate::mutate;
use crate::rng::Rng;
use crate::targets::Target;

/// How long and from where a run goes.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Stop after this many inputs.
    pub(crate) iters: Option<u64>,
    /// Stop after this long.
    pub(crate) seconds: Option<f64>,
    /// The run's seed.
    pub(crate) seed: u64,
    /// The index of the first input.
    pub(crate) start: u64,
    /// Run just this input.
    pub(crate) input: Option<Vec<u8>>,
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Summary {
    /// Inputs run.
    pub(crate) inputs: u64,
    /// Time taken.
    pub(crate) elapsed: Duration,
    /// The largest single allocation of any input.
    pub(crate) largest: usize,
    /// The most bytes any input allocated in total.
    pub(crate) total: usize,
    /// Corpus entries.
    pub(crate) corpus: usize,
}

/// A finding.
#[derive(Debug)]
pub(crate) struct Finding {
    /// What went wrong.
    pub(crate) what: String,
    /// The input.
    pub(crate) input: Vec<u8>,
    /// Its index in the run.
    pub(crate) index: u64,
}

/// Loads the corpus of `target` from `dir/<name>/` (files sorted by name); falls back to the
/// seeds made in memory when the directory is missing or empty.
pub(crate) fn load_corpus(dir: &Path, target: &Target) -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join(target.name))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let corpus: Vec<Vec<u8>> = files.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    if corpus.is_empty() {
        eprintln!(
            "rdmx-fuzz: no corpus in {}; using the seeds made in memory",
            dir.join(target.name).display()
        );
        return (target.seeds)().into_iter().map(|(_, v)| v).collect();
    }
    corpus
}

/// Input `index` of a run seeded `seed`: a corpus entry as it is for the first indices,
/// then mutations of the corpus, and now and then random bytes.
fn generate(target: &Target, corpus: &[Vec<u8>], seed: u64, index: u64) -> Vec<u8> {
    if let Some(entry) = usize::try_from(index).ok().and_then(|i| corpus.get(i)) {
        return entry.clone();
    }
    let mut rng = Rng::for_input(seed, index);
    if corpus.is_empty() || rng.one_in(16) {
        let up_to = rng.below(target.max_len) + 1;
        let len = rng.below(up_to);
        return (0..len).map(|_| rng.byte()).collect();
    }
    let mut data = rng.pick(corpus).clone();
    let other = rng.pick(corpus).clone();
    if target.framed && !rng.one_in(3) {
        mutate::mutate_records(&mut rng, &mut data, &other, target.max_len);
    } else {
        mutate::mutate(&mut rng, &mut data, &other, target.max_len);
    }
    data
}

/// Runs target number `number` as `opts` says.
///
/// # Errors
/// The first finding.
pub(crate) fn run(
    number: usize,
    target: &Target,
    corpus: &[Vec<u8>],
    opts: &Options,
) -> Result<Summary, Finding> {
    let mut runner = (target.runner)();
    let started = Instant::now();
    let deadline = opts.seconds.map(|s| started + Duration::from_secs_f64(s));
    let mut sum = Summary {
        corpus: corpus.len(),
        ..Summary::default()
    };
    let mut index = opts.start;
    loop {
        let done = match &opts.input {
            Some(_) => sum.inputs == 1,
            None => {
                opts.iters.is_some_and(|n| sum.inputs >= n)
                    || deadline.is_some_and(|d| Instant::now() >= d)
                    || (opts.iters.is_none() && deadline.is_none() && sum.inputs >= 10_000)
            }
        };
        if done {
            break;
        }
        let input = match &opts.input {
            Some(i) => i.clone(),
            None => generate(target, corpus, opts.seed, index),
        };
        runner.reset();
        alloc::arm(number, opts.seed, index);
        let outcome = catch_unwind(AssertUnwindSafe(|| runner.run(&input)));
        let usage = alloc::disarm();
        sum.inputs += 1;
        sum.largest = sum.largest.max(usage.largest);
        sum.total = sum.total.max(usage.total);
        let what = if outcome.is_err() {
            Some("a panic (message above)".to_owned())
        } else if usage.largest > target.max_alloc {
            Some(format!(
                "an allocation of {} bytes, over the target's bound of {}",
                usage.largest, target.max_alloc
            ))
        } else if usage.total > target.max_total {
            Some(format!(
                "{} bytes allocated for one input, over the target's bound of {}",
                usage.total, target.max_total
            ))
        } else {
            None
        };
        if let Some(what) = what {
            return Err(Finding { what, input, index });
        }
        index += 1;
    }
    sum.elapsed = started.elapsed();
    Ok(sum)
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Bytes from hex (whitespace ignored).
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(unhex("00 01ab\nff").as_deref(), Some(&b[..]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }
}
