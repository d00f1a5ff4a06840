//! The multicast group flows of `netns_groups.rs` on this host's loopback, each member a
//! process of its own with a soft device on 127.0.0.1 (no root needed): 5 % loss at the
//! members, a member killed mid-stream, a late joiner, a stranger's garbage and forgeries;
//! a slow reader and a stalled member; a killed publisher. The group names are this
//! process's own, so that runs side by side do not meet.
#![forbid(unsafe_code)]

mod group_flows;

use group_flows::{
    Place, killed_publisher, loss_death_late_joiner_forgeries, slow_reader_and_stalled_member,
};

fn name(flow: &str) -> String {
    format!("loopback-{flow}-{}", std::process::id())
}

#[test]
fn a_group_on_loopback_with_loss_a_death_a_late_joiner_and_forgeries() {
    loss_death_late_joiner_forgeries(&Place::Loopback, &name("loss"));
}

#[test]
fn on_loopback_a_slow_reader_paces_the_publisher_and_a_stalled_member_is_removed() {
    slow_reader_and_stalled_member(&Place::Loopback, &name("slow"));
}

#[test]
fn on_loopback_a_killed_publisher_is_reported_to_its_members() {
    killed_publisher(&Place::Loopback, &name("pubdeath"));
}
