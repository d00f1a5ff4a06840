//! # rdmx-tests
//!
//! Test infrastructure for rdmx: multi-process tests and multi-host tests in Linux network
//! namespaces.
//!
//! * [`netns`]: a [`Topology`] of hosts (network namespaces), veth links and
//!   bridges, built with the `ip` command and deleted on drop; [`require_netns_or_skip`]
//!   for tests that need root.
//! * [`process`]: child processes with deadlines, captured output and process-group kills.
//! * [`bins`]: finding the `rdmx` command (another package's binary) from a test.
//! * [`probe`]: a UDP echo server and pinger (the `rdmx-netns-probe` binary) to check that
//!   hosts reach each other without `ping`.
//! * [`json`]: a small JSON reader for `rdmx perf --json` and `ip -j`.
//! * [`lines`]: reading the line-oriented output of the `rdmx-netns-roles` programs (the
//!   multicast and path-migration roles run inside the hosts).
#![forbid(unsafe_code)]

pub mod bins;
pub mod json;
pub mod lines;
pub mod netns;
pub mod probe;
pub mod process;

pub use netns::{Hosts, NetnsError, Topology, netns_available, require_netns_or_skip};
