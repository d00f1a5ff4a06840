//! The conformance suite of the verbs API: RC (send / receive / write / read / atomics and
//! error statuses, two processes), UC, UD and GRH, multicast, SRQ and its events,
//! tag-matching SRQs, XRC, APM, memory windows and batch posting (`ibv_wr_*`).
//!
//! It runs on `RDMX_TEST_DEVICE` (default: a soft device on loopback), so the same cases
//! check a hardware provider: `RDMX_TEST_DEVICE=mlx5_0 cargo test -p rdmx-verbs --test
//! conformance`. Cases a device cannot run (a missing capability from `query_device`) print
//! `SKIPPED <case> on <device>: <reason>` instead of passing silently.

#[path = "../common/mod.rs"]
mod common;

mod apm;
mod batch;
mod channel;
mod cm;
mod mw;
mod rc;
mod srq;
mod tm;
mod uc;
mod ud;
mod wr_api;
mod xrc;
mod xrc_shared;
