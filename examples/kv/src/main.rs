//! `rdmx-kv`: the KV-store demo's command.
//!
//! ```sh
//! rdmx-kv bench --local [--workload a|b|c] [--dist zipf|uniform] [--value-size 64]
//!                [--clients 1] [--threads 0 (one per client)] [--depth 1] [--secs 5] [--keys 10000] [--get one-sided|rpc] [--json]
//! rdmx-kv serve [--listen 127.0.0.1:7100] [--slots 65536] [--max-value 1024] [--readers 1]
//! rdmx-kv put KEY VALUE [--connect 127.0.0.1:7100]
//! rdmx-kv get KEY [--connect ADDR] [--rpc]
//! rdmx-kv del KEY [--connect ADDR]
//! rdmx-kv bench --connect ADDR ...
//! ```
//!
//! `bench --local` starts a server in this process (its own context, on loopback) and runs
//! the bench against it.

use std::error::Error;
use std::process::ExitCode;

use rdmx_kv::bench::{BenchOptions, run};
use rdmx_kv::workload::{Dist, Mix};
use rdmx_kv::{KvClient, KvServer, ServerOptions};

const DEFAULT_ADDR: &str = "127.0.0.1:7100";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cli(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdmx-kv: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--name value` options after the positional arguments.
struct Opts<'a> {
    pos: Vec<&'a str>,
    kv: Vec<(&'a str, Option<&'a str>)>,
}

impl<'a> Opts<'a> {
    fn parse(args: &'a [String], flags: &[&str]) -> Result<Self, String> {
        let (mut pos, mut kv) = (Vec::new(), Vec::new());
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.strip_prefix("--") {
                Some(name) if flags.contains(&name) => kv.push((name, None)),
                Some(name) => {
                    let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
                    kv.push((name, Some(v.as_str())));
                }
                None => pos.push(a.as_str()),
            }
        }
        Ok(Self { pos, kv })
    }

    fn get(&self, name: &str) -> Option<&'a str> {
        self.kv
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| *v)
    }

    fn flag(&self, name: &str) -> bool {
        self.kv.iter().any(|(n, _)| *n == name)
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name} {v:?}: not a number")),
        }
    }

    fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.kv.iter().find(|(n, _)| !known.contains(n)) {
            Some((n, _)) => Err(format!("unknown option --{n}")),
            None => Ok(()),
        }
    }
}

fn bench_options(o: &Opts<'_>) -> Result<BenchOptions, String> {
    let d = BenchOptions::default();
    let mix = match o.get("workload").unwrap_or("b") {
        "a" | "A" => Mix::A,
        "b" | "B" => Mix::B,
        "c" | "C" => Mix::C,
        w => return Err(format!("--workload {w:?}: a, b or c")),
    };
    let dist = match o.get("dist").unwrap_or("zipf") {
        "zipf" => Dist::Zipf(0.99),
        "uniform" => Dist::Uniform,
        x => return Err(format!("--dist {x:?}: zipf or uniform")),
    };
    let one_sided = match o.get("get").unwrap_or("one-sided") {
        "one-sided" => true,
        "rpc" => false,
        x => return Err(format!("--get {x:?}: one-sided or rpc")),
    };
    let b = BenchOptions {
        mix,
        dist,
        keys: o.num("keys", d.keys)?,
        value_size: o.num("value-size", d.value_size)?,
        clients: o.num("clients", d.clients)?,
        threads: o.num("threads", d.threads)?,
        depth: o.num("depth", d.depth)?,
        secs: o.num("secs", d.secs)?,
        one_sided,
    };
    if b.value_size < 16 || b.keys == 0 || b.clients == 0 || b.depth == 0 || b.secs <= 0.0 {
        return Err("--value-size at least 16; --keys, --clients, --depth, --secs above 0".into());
    }
    if b.clients > 256 {
        return Err("--clients at most 256".into());
    }
    Ok(b)
}

fn cli(args: &[String]) -> Result<(), Box<dyn Error>> {
    let Some(cmd) = args.first() else {
        return Err("usage: rdmx-kv (bench | serve | get | put | del) ... (see the source)".into());
    };
    let o = Opts::parse(&args[1..], &["local", "json", "rpc"])?;
    let addr = o.get("connect").unwrap_or(DEFAULT_ADDR);
    match cmd.as_str() {
        "serve" => {
            o.only(&["listen", "slots", "max-value", "readers"])?;
            let s = KvServer::start(
                o.get("listen").unwrap_or(DEFAULT_ADDR),
                ServerOptions {
                    slots: o.num("slots", ServerOptions::default().slots)?,
                    max_value: o.num("max-value", ServerOptions::default().max_value)?,
                    readers: o.num("readers", ServerOptions::default().readers)?,
                },
            )?;
            println!("LISTEN {}", s.local_addr());
            loop {
                std::thread::park();
            }
        }
        "put" => {
            o.only(&["connect"])?;
            let [k, v] = o.pos[..] else {
                return Err("usage: rdmx-kv put KEY VALUE [--connect ADDR]".into());
            };
            KvClient::connect(addr)?.put(k.as_bytes(), v.as_bytes())?;
        }
        "get" => {
            o.only(&["connect", "rpc"])?;
            let [k] = o.pos[..] else {
                return Err("usage: rdmx-kv get KEY [--connect ADDR] [--rpc]".into());
            };
            let c = KvClient::connect(addr)?;
            let v = if o.flag("rpc") {
                c.get_rpc(k.as_bytes())?
            } else {
                c.get_one_sided(k.as_bytes())?
            };
            match v {
                Some(v) => println!("{}", String::from_utf8_lossy(&v)),
                None => return Err(format!("{k}: not found").into()),
            }
        }
        "del" => {
            o.only(&["connect"])?;
            let [k] = o.pos[..] else {
                return Err("usage: rdmx-kv del KEY [--connect ADDR]".into());
            };
            if !KvClient::connect(addr)?.del(k.as_bytes())? {
                return Err(format!("{k}: not found").into());
            }
        }
        "bench" => {
            o.only(&[
                "local",
                "connect",
                "json",
                "workload",
                "dist",
                "keys",
                "value-size",
                "clients",
                "threads",
                "depth",
                "secs",
                "get",
                "readers",
            ])?;
            let b = bench_options(&o)?;
            let local = if o.flag("local") {
                Some(KvServer::start(
                    "127.0.0.1:0",
                    ServerOptions {
                        slots: (b.keys * 2).max(1024).next_power_of_two(),
                        max_value: b.value_size.max(64) as u32,
                        readers: o.num("readers", ServerOptions::default().readers)?,
                    },
                )?)
            } else {
                None
            };
            let target = match &local {
                Some(s) => s.local_addr(),
                None => addr.parse()?,
            };
            let r = run(target, &b, !o.flag("json"))?;
            if o.flag("json") {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.table());
            }
            if r.bad_values > 0 || r.missing > 0 || r.errors > 0 {
                return Err("some operations failed or read bad values".into());
            }
        }
        other => return Err(format!("unknown command {other:?}").into()),
    }
    Ok(())
}
