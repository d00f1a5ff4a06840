//! The run: participants started, followed and summed up.

use super::*;

/// The live line (stderr, once a second).
#[derive(Debug)]
pub(crate) struct Progress {
    pub(crate) t0: Instant,
    pub(crate) last: Instant,
    pub(crate) last_min: u64,
    pub(crate) shown: bool,
}

impl Progress {
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        Self {
            t0: now,
            last: now,
            last_min: 0,
            shown: false,
        }
    }

    pub(crate) fn tick(&mut self, published: u64, subs: &[Participant]) {
        if self.last.elapsed() < Duration::from_secs(1) {
            return;
        }
        let min = subs.iter().map(Participant::count).min().unwrap_or(0);
        let rate = min.saturating_sub(self.last_min) as f64 / self.last.elapsed().as_secs_f64();
        eprint!(
            "\r{:.0} s: published {published}, slowest subscriber {min} ({rate:.0} msg/s)   ",
            self.t0.elapsed().as_secs_f64(),
        );
        (self.last, self.last_min, self.shown) = (Instant::now(), min, true);
    }

    pub(crate) fn end(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

/// `o.pubs` publishers and `o.subs` subscribers, each with its own context, for `o.secs`
/// seconds; children (`--procs`, `--netns`) started with `launcher`.
pub(crate) fn bench(o: &BenchOptions, launcher: &Launcher) -> Result<BenchReport, String> {
    o.check()?;
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let topic = format!(
        "rdmx-pubsub-bench-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    // Declared first, so dropped (torn down) last, once every participant ended.
    let netns = match o.mode {
        Mode::Netns => Some(Netns::create(o.pubs, o.subs, launcher)?),
        Mode::Threads | Mode::Procs => None,
    };
    let ro = RoleOptions {
        topic,
        pubs: o.pubs,
        members: o.pubs + o.subs - 1,
        size: o.size,
        secs: o.secs,
        rate: o.rate,
        reliable: o.reliable,
        device: None,
    };
    let mut pubs = Vec::new();
    let mut subs = Vec::new();
    for k in 0..o.pubs + o.subs {
        let (role, name) = if k < o.pubs {
            (Role::Pub, format!("publisher {k}"))
        } else {
            (Role::Sub, format!("subscriber {}", k - o.pubs))
        };
        let p = match &netns {
            None if o.mode == Mode::Threads => Participant::thread(name, role, ro.clone())?,
            None => Participant::process(name, launcher.command(None, &ro.args(role)))?,
            Some(n) => {
                let (ns, addr) = n.host(k)?;
                let ro = RoleOptions {
                    device: Some(format!("soft:{addr}")),
                    ..ro.clone()
                };
                Participant::process(name, launcher.command(Some(ns), &ro.args(role)))?
            }
        };
        match role {
            Role::Pub => pubs.push(p),
            Role::Sub => subs.push(p),
        }
    }
    // Every one joined.
    let deadline = Instant::now() + SETTLE;
    for i in 0..pubs.len() + subs.len() {
        loop {
            let p = if i < pubs.len() {
                &pubs[i]
            } else {
                &subs[i - pubs.len()]
            };
            if p.ready() {
                break;
            }
            if p.finished() || Instant::now() > deadline {
                let p = if i < pubs.len() {
                    pubs.swap_remove(i)
                } else {
                    subs.swap_remove(i - pubs.len())
                };
                let name = p.name.clone();
                return Err(match p.join(Instant::now()) {
                    Err(e) => format!("{e} (before joining the group)"),
                    Ok(_) => format!("{name} did not join the group within {SETTLE:?}"),
                });
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
    let mut progress = Progress::new();
    for p in &mut pubs {
        p.go();
    }
    while !pubs.iter().all(Participant::done) {
        thread::sleep(Duration::from_millis(20));
        progress.tick(pubs.iter().map(Participant::count).sum(), &subs);
    }
    let secs = progress.t0.elapsed().as_secs_f64();
    // The subscribers have every end mark once the reliable publishers are done; an
    // unreliable group may lose one. (A publisher that failed: no waiting.)
    let drain = Instant::now()
        + if o.reliable {
            SETTLE
        } else {
            Duration::from_secs(2)
        };
    let published = pubs.iter().map(Participant::count).sum();
    while pubs.iter().all(|p| p.ctl.ended.load(Ordering::Acquire))
        && !subs.iter().all(Participant::done)
        && Instant::now() < drain
    {
        thread::sleep(Duration::from_millis(5));
        progress.tick(published, &subs);
    }
    progress.end();
    for p in pubs.iter_mut().chain(&mut subs) {
        p.stop();
    }
    let deadline = Instant::now() + SETTLE;
    let pub_results = pubs
        .into_iter()
        .map(|p| match p.join(deadline)? {
            Outcome::Pub(r) => Ok(r),
            Outcome::Sub(_) => Err("a publisher reported as a subscriber".to_string()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sub_results = subs
        .into_iter()
        .map(|s| match s.join(deadline)? {
            Outcome::Sub(r) => Ok(r),
            Outcome::Pub(_) => Err("a subscriber reported as a publisher".to_string()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(netns);
    Ok(BenchReport::new(o, secs, &pub_results, &sub_results))
}

/// What `bench` measured.
#[derive(Debug, Default)]
pub(crate) struct BenchReport {
    pub(crate) mode: &'static str,
    pub(crate) pubs: usize,
    pub(crate) subs: usize,
    pub(crate) size: usize,
    pub(crate) reliable: bool,
    /// The rate each publisher was asked for.
    pub(crate) target_rate: Option<f64>,
    pub(crate) published: u64,
    /// From the publishers' start to their end (the last taken by every member).
    pub(crate) secs: f64,
    /// Messages per second each subscriber got (every publisher's).
    pub(crate) rates: Vec<f64>,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    /// Repairs the subscribers asked for.
    pub(crate) naks_sent: u64,
    /// Repairs the publishers asked for (of each other's streams).
    pub(crate) pub_naks_sent: u64,
    pub(crate) repairs_sent: u64,
    pub(crate) removed: u64,
    pub(crate) lost: u64,
    pub(crate) out_of_order: u64,
}

impl BenchReport {
    pub(crate) fn new(o: &BenchOptions, secs: f64, pubs: &[PubResult], subs: &[SubResult]) -> Self {
        let mut lat = Histogram::default();
        let mut r = Self {
            mode: o.mode.name(),
            pubs: o.pubs,
            subs: o.subs,
            size: o.size,
            reliable: o.reliable,
            target_rate: o.rate,
            published: pubs.iter().map(|p| p.published).sum(),
            secs,
            repairs_sent: pubs.iter().map(|p| p.repairs_sent).sum(),
            pub_naks_sent: pubs.iter().map(|p| p.naks_sent).sum(),
            removed: pubs.iter().map(|p| p.removed).sum(),
            ..Self::default()
        };
        for s in subs {
            r.rates.push(s.rate(secs));
            r.naks_sent += s.naks_sent;
            lat.merge(&s.lat);
            r.out_of_order += s.streams.iter().map(|x| x.out_of_order).sum::<u64>();
            // Per publisher: the gaps, and what came after the last message received.
            for p in pubs {
                r.lost += match s.streams.iter().find(|x| x.publisher == p.member) {
                    Some(x) => x.gaps + p.published.saturating_sub(x.next),
                    None => p.published,
                };
            }
        }
        (r.p50_us, r.p99_us, r.p999_us) = (
            lat.quantile_us(0.5),
            lat.quantile_us(0.99),
            lat.quantile_us(0.999),
        );
        r
    }

    pub(crate) fn json(&self) -> String {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        let target = self
            .target_rate
            .map_or_else(|| "null".to_string(), |r| format!("{r}"));
        format!(
            "{{\"mode\":\"{}\",\"pubs\":{},\"subs\":{},\"size\":{},\"reliable\":{},\
             \"target_rate\":{target},\"published\":{},\"secs\":{:.3},\"rate_per_sub\":[{}],\
             \"lat_p50_us\":{:.1},\"lat_p99_us\":{:.1},\"lat_p999_us\":{:.1},\"naks_sent\":{},\
             \"pub_naks_sent\":{},\"repairs_sent\":{},\"removed\":{},\"lost\":{},\"out_of_order\":{}}}",
            self.mode,
            self.pubs,
            self.subs,
            self.size,
            self.reliable,
            self.published,
            self.secs,
            rates.join(","),
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.naks_sent,
            self.pub_naks_sent,
            self.repairs_sent,
            self.removed,
            self.lost,
            self.out_of_order
        )
    }

    pub(crate) fn table(&self) -> String {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        format!(
            "{}: {} publisher(s), {} subscriber(s), {} B, {}: {} published in {:.2} s\n\
             delivered msg/s per subscriber: {}\n\
             publish->deliver latency: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us\n\
             repairs asked {} (and {} by publishers), served {}; members removed {}; \
             messages lost {}, out of order {}\n",
            self.mode,
            self.pubs,
            self.subs,
            self.size,
            if self.reliable {
                "reliable"
            } else {
                "unreliable"
            },
            self.published,
            self.secs,
            rates.join(", "),
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.naks_sent,
            self.pub_naks_sent,
            self.repairs_sent,
            self.removed,
            self.lost,
            self.out_of_order
        )
    }
}
