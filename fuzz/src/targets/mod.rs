//! The fuzz targets: one per decoder of network input (and the state machine that consumes
//! what it decodes, where that runs without a live connection).

mod bootstrap;
mod cm;
mod header;
mod mcast;
mod nic;
mod rc_words;
mod rpc;
mod tm;
mod ud;
mod wire;

/// Runs inputs of one target.
pub(crate) trait Runner {
    /// Prepares fresh state for the next input (not counted by the allocation meter).
    fn reset(&mut self) {}

    /// Runs one input. Any panic is a finding.
    fn run(&mut self, input: &[u8]);
}

/// A fuzz target.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// Its name on the command line and its corpus directory.
    pub(crate) name: &'static str,
    /// What it covers.
    pub(crate) about: &'static str,
    /// The largest single allocation one input may make, in bytes.
    pub(crate) max_alloc: usize,
    /// The most bytes one input may allocate in total.
    pub(crate) max_total: usize,
    /// The longest input generated.
    pub(crate) max_len: usize,
    /// Inputs are records ([`crate::records`]): mutate them record-wise too.
    pub(crate) framed: bool,
    /// The seed inputs, made with the encoders (what `rdmx-fuzz corpus` writes).
    pub(crate) seeds: fn() -> Vec<(String, Vec<u8>)>,
    /// A runner.
    pub(crate) runner: fn() -> Box<dyn Runner>,
}

/// Every target, in the order `all` runs them.
pub(crate) const TARGETS: &[Target] = &[
    wire::TARGET,
    nic::BARE,
    nic::QPS,
    nic::ICRC,
    nic::STATES,
    cm::TARGET,
    bootstrap::TARGET,
    header::TARGET,
    rc_words::TARGET,
    ud::WIRE,
    ud::SESSION,
    mcast::WIRE,
    mcast::MEMBER,
    rpc::TARGET,
    tm::TARGET,
];

/// The target named `name`.
pub(crate) fn find(name: &str) -> Option<(usize, &'static Target)> {
    TARGETS.iter().enumerate().find(|(_, t)| t.name == name)
}

/// The name of target number `i` (for reports).
pub(crate) fn name_of(i: usize) -> &'static str {
    TARGETS.get(i).map_or("?", |t| t.name)
}

/// A runner of a stateless decoder function.
pub(crate) struct FnRunner(pub(crate) fn(&[u8]));

impl Runner for FnRunner {
    fn run(&mut self, input: &[u8]) {
        (self.0)(input);
    }
}

/// Names seeds `prefix_000`, `prefix_001`, ...
pub(crate) fn numbered(prefix: &str, items: Vec<Vec<u8>>) -> Vec<(String, Vec<u8>)> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| (format!("{prefix}_{i:03}"), v))
        .collect()
}
