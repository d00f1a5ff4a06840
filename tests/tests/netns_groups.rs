//! Reliable multicast groups (`Context::join`) between hosts: network namespaces on one
//! bridge, each member a process of its own (root only; skipped otherwise unless
//! `RDMX_REQUIRE_NETNS=1`).
//!
//! * 5 % of the frames each receiving member's device gets are dropped; every live member
//!   still gets every message once, in order and intact; a member killed mid-stream is
//!   removed (an event at the publisher) and the others go on; a late joiner gets a gapless
//!   tail of the stream up to its end; malformed and forged datagrams sent to the group's
//!   address by a stranger are dropped and counted.
//! * A slow reader paces the publisher and gets everything; a member that stops reading is
//!   removed after the slow timeout, with an event on both sides.
//! * A publisher killed mid-stream is reported gone to its members.
//!
//! The roles are the `group-*` subcommands of `rdmx-netns-roles`; the flows are in
//! `group_flows/` (`loopback_groups.rs` runs them on loopback).
#![forbid(unsafe_code)]

mod group_flows;

use group_flows::{
    LOSS_HOSTS, PUBDEATH_HOSTS, Place, SLOW_HOSTS, killed_publisher,
    loss_death_late_joiner_forgeries, slow_reader_and_stalled_member,
};
use rdmx_tests::netns::require_netns_or_skip;

#[test]
fn a_group_across_namespaces_with_loss_a_death_a_late_joiner_and_forgeries() {
    if require_netns_or_skip(
        "a_group_across_namespaces_with_loss_a_death_a_late_joiner_and_forgeries",
    ) {
        loss_death_late_joiner_forgeries(&Place::netns(&LOSS_HOSTS), "netns-loss");
    }
}

#[test]
fn a_slow_reader_paces_the_publisher_and_a_stalled_member_is_removed() {
    if require_netns_or_skip("a_slow_reader_paces_the_publisher_and_a_stalled_member_is_removed") {
        slow_reader_and_stalled_member(&Place::netns(&SLOW_HOSTS), "netns-slow");
    }
}

#[test]
fn a_killed_publisher_is_reported_to_its_members() {
    if require_netns_or_skip("a_killed_publisher_is_reported_to_its_members") {
        killed_publisher(&Place::netns(&PUBDEATH_HOSTS), "netns-pubdeath");
    }
}
