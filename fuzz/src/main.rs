//! `rdmx-fuzz`: fuzzes the decoders of network input on stable Rust.
//!
//! Each target ([`targets::TARGETS`]) runs inputs made from a committed corpus
//! (`fuzz/corpus/<target>/`, real encodings written by `rdmx-fuzz corpus`): first every entry
//! as it is, then mutations of them and random bytes, all from a seeded PRNG. A panic, or an
//! allocation over the target's bound (measured by a counting global allocator), stops the
//! run with the input in hex and the command that replays it.
//!
//! ```text
//! rdmx-fuzz list
//! rdmx-fuzz corpus [--out DIR] [--only TARGET]
//! rdmx-fuzz <target|all> [--iters N] [--seconds S] [--seed X] [--start I]
//!                        [--hex HEX | --file PATH] [--corpus DIR]
//! ```
//!
//! See `docs/FUZZING.md`.

mod alloc;
mod driver;
mod mutate;
mod records;
mod rng;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;

use driver::Options;
use targets::TARGETS;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

/// The committed corpus.
fn default_corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

const USAGE: &str = "usage:
  rdmx-fuzz list                      the targets
  rdmx-fuzz corpus [--out DIR] [--only TARGET]
                                      writes the seed corpus (default fuzz/corpus), of
                                      every target or of one
  rdmx-fuzz <target|all> [--iters N] [--seconds S] [--seed X] [--start I]
                         [--hex HEX | --file PATH] [--corpus DIR]
      runs inputs until N inputs or S seconds (per target); without either, 10000 inputs.
      --seed X   the run's seed (decimal or 0x-hex; default: from the clock, printed)
      --start I  the index of the first input (a report names the one to replay)
      --hex/--file  runs that one input";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match real_main(&args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("rdmx-fuzz: {msg}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn real_main(args: &[String]) -> Result<ExitCode, String> {
    let Some(command) = args.first() else {
        return Err("no command".into());
    };
    let mut opts = Options {
        iters: None,
        seconds: None,
        seed: clock_seed(),
        start: 0,
        input: None,
    };
    let mut corpus_dir = default_corpus();
    let mut out_dir = default_corpus();
    let mut only: Option<String> = None;
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let mut value = || {
            rest.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--iters" => opts.iters = Some(parse_u64(&value()?)?),
            "--seconds" => {
                let v = value()?;
                opts.seconds = Some(v.parse().map_err(|_| format!("bad --seconds {v}"))?);
            }
            "--seed" => opts.seed = parse_u64(&value()?)?,
            "--start" => opts.start = parse_u64(&value()?)?,
            "--hex" => {
                let v = value()?;
                opts.input = Some(driver::unhex(&v).ok_or("bad --hex")?);
            }
            "--file" => {
                let v = value()?;
                opts.input = Some(std::fs::read(&v).map_err(|e| format!("{v}: {e}"))?);
            }
            "--corpus" => corpus_dir = PathBuf::from(value()?),
            "--out" => out_dir = PathBuf::from(value()?),
            "--only" => only = Some(value()?),
            other => return Err(format!("unknown option {other}")),
        }
    }
    match command.as_str() {
        "list" => {
            for t in TARGETS {
                println!("{:14} {}", t.name, t.about);
            }
            Ok(ExitCode::SUCCESS)
        }
        "corpus" => write_corpus(&out_dir, only.as_deref()),
        "all" => {
            let all: Vec<usize> = (0..TARGETS.len()).collect();
            Ok(run_targets(&all, &opts, &corpus_dir))
        }
        name => {
            let (i, _) = targets::find(name).ok_or_else(|| format!("no target {name}"))?;
            Ok(run_targets(&[i], &opts, &corpus_dir))
        }
    }
}

/// Runs the targets one after the other; stops at the first finding.
fn run_targets(which: &[usize], opts: &Options, corpus_dir: &std::path::Path) -> ExitCode {
    println!("rdmx-fuzz: seed {:#x}", opts.seed);
    for &i in which {
        let t = &TARGETS[i];
        let corpus = driver::load_corpus(corpus_dir, t);
        match driver::run(i, t, &corpus, opts) {
            Ok(s) => {
                let secs = s.elapsed.as_secs_f64();
                println!(
                    "{:14} {:>10} inputs in {:7.1} s ({:>8.0}/s), corpus {:3}; largest allocation \
                     {} (bound {}), most allocated by one input {} (bound {})",
                    t.name,
                    s.inputs,
                    secs,
                    s.inputs as f64 / secs.max(1e-9),
                    s.corpus,
                    s.largest,
                    t.max_alloc,
                    s.total,
                    t.max_total,
                );
            }
            Err(f) => {
                eprintln!(
                    "rdmx-fuzz: target {}: {} on input #{} of seed {:#x}\ninput ({} bytes): {}\n\
                     replay with: rdmx-fuzz {} --seed {:#x} --start {} --iters 1\n\
                     or: rdmx-fuzz {} --hex {}",
                    t.name,
                    f.what,
                    f.index,
                    opts.seed,
                    f.input.len(),
                    driver::hex(&f.input),
                    t.name,
                    opts.seed,
                    f.index,
                    t.name,
                    driver::hex(&f.input),
                );
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// Writes every target's seeds (or those of target `only`) to `dir/<target>/<name>.bin`,
/// replacing what was there.
fn write_corpus(dir: &std::path::Path, only: Option<&str>) -> Result<ExitCode, String> {
    if let Some(name) = only
        && targets::find(name).is_none()
    {
        return Err(format!("no target {name}"));
    }
    for t in TARGETS.iter().filter(|t| only.is_none_or(|n| n == t.name)) {
        let sub = dir.join(t.name);
        if sub.exists() {
            std::fs::remove_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.display()))?;
        }
        std::fs::create_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.display()))?;
        let seeds = (t.seeds)();
        for (name, bytes) in &seeds {
            let path = sub.join(format!("{name}.bin"));
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        println!("{:14} {} seeds", t.name, seeds.len());
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("bad number {s}"))
}

/// A seed from the clock (the run prints it).
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id())
}
