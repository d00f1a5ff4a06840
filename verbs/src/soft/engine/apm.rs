//! Automatic path migration (spec §8): the alternate path, the MIGRATED / REARM / ARMED
//! states and the MigReq bit, migration on retry exhaustion, on a local port failure, on
//! request, or when the peer has migrated; and the path-migrated / migration-error events.

use std::net::SocketAddr;

use super::qp::{Path, Qp};
use super::{AsyncEvent, Nic, Resources};
use crate::error::VerbsError;
use crate::types::{MigState, QpAttrMask as M, QpState, QpType};

impl Qp {
    /// The path described by the alternate-path attributes.
    pub(crate) fn alt_path_from_attrs(&self, res: &Resources) -> Result<Path, VerbsError> {
        let port = usize::from(self.attr.alt_port_num).saturating_sub(1);
        let local =
            res.cfg
                .ports
                .get(port)
                .copied()
                .ok_or_else(|| VerbsError::InvalidAttribute {
                    attr: "ALT_PATH",
                    reason: format!("alternate port {} does not exist", self.attr.alt_port_num),
                })?;
        let av = self.attr.alt_ah_attr;
        if av.dgid.is_multicast() || av.dgid.to_ip().is_unspecified() {
            return Err(VerbsError::InvalidAttribute {
                attr: "ALT_PATH",
                reason: "the alternate destination must be a unicast GID".into(),
            });
        }
        Ok(Path {
            port,
            local,
            remote: SocketAddr::new(av.dgid.to_ip(), av.udp_port),
        })
    }

    /// Checks `ALT_PATH` / `PATH_MIG_STATE` of a `modify` call before anything changes, so a
    /// rejected call leaves the QP as it was (verbs modifies are all or nothing).
    pub(crate) fn check_apm(
        &self,
        res: &Resources,
        a: &crate::types::QpAttr,
        mask: M,
        to: QpState,
    ) -> Result<(), VerbsError> {
        let bad = |reason: &str| {
            Err(VerbsError::InvalidAttribute {
                attr: "PATH_MIG_STATE",
                reason: reason.into(),
            })
        };
        if mask.contains(M::ALT_PATH) {
            let port = usize::from(a.alt_port_num).saturating_sub(1);
            if res.cfg.ports.get(port).is_none() {
                return Err(VerbsError::InvalidAttribute {
                    attr: "ALT_PATH",
                    reason: format!("alternate port {} does not exist", a.alt_port_num),
                });
            }
            let g = a.alt_ah_attr.dgid;
            if g.is_multicast() || g.to_ip().is_unspecified() {
                return Err(VerbsError::InvalidAttribute {
                    attr: "ALT_PATH",
                    reason: "the alternate destination must be a unicast GID".into(),
                });
            }
            // The QP sends at its path MTU on whichever path it is: the alternate port must
            // carry it, as the primary port must at RTR.
            let mtu = if mask.contains(M::PATH_MTU) {
                a.path_mtu
            } else {
                self.attr.path_mtu
            };
            if let Some(active) = res.cfg.port_mtus.get(port).copied()
                && mtu > active
            {
                return Err(VerbsError::InvalidAttribute {
                    attr: "ALT_PATH",
                    reason: format!(
                        "the path MTU of {} bytes is larger than alternate port {}'s active MTU \
                         of {} bytes",
                        mtu.bytes(),
                        a.alt_port_num,
                        active.bytes()
                    ),
                });
            }
        }
        if !mask.contains(M::PATH_MIG_STATE) {
            return Ok(());
        }
        match a.path_mig_state {
            MigState::Armed => bad("software cannot set ARMED"),
            MigState::Rearm if !mask.contains(M::ALT_PATH) && self.alt_path.is_none() => {
                bad("REARM needs an alternate path (ALT_PATH)")
            }
            MigState::Migrated => match self.attr.path_mig_state {
                MigState::Armed if to != QpState::Rts => bad("a manual migration needs RTS"),
                MigState::Rearm => bad("can only migrate from ARMED"),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Applies `ALT_PATH` / `PATH_MIG_STATE` from a `modify` call (after the other
    /// attributes). `requested` is the state asked for, if any.
    pub(crate) fn apply_apm(
        &mut self,
        now: u64,
        res: &mut Resources,
        mask: M,
        requested: Option<MigState>,
    ) -> Result<(), VerbsError> {
        if mask.contains(M::ALT_PATH) {
            self.alt_path = Some(self.alt_path_from_attrs(res)?);
        }
        match requested {
            None => {}
            Some(MigState::Rearm) => {
                if self.alt_path.is_none() {
                    return Err(VerbsError::InvalidAttribute {
                        attr: "PATH_MIG_STATE",
                        reason: "REARM needs an alternate path (ALT_PATH)".into(),
                    });
                }
                self.attr.path_mig_state = MigState::Rearm;
            }
            Some(MigState::Migrated) => {
                if self.attr.path_mig_state == MigState::Armed {
                    if self.state() != QpState::Rts {
                        return Err(VerbsError::InvalidAttribute {
                            attr: "PATH_MIG_STATE",
                            reason: "a manual migration needs the QP in RTS".into(),
                        });
                    }
                    self.migrate(now, res);
                } else if self.attr.path_mig_state != MigState::Migrated {
                    return Err(VerbsError::InvalidAttribute {
                        attr: "PATH_MIG_STATE",
                        reason: "can only migrate from ARMED".into(),
                    });
                }
            }
            Some(MigState::Armed) => {
                return Err(VerbsError::InvalidAttribute {
                    attr: "PATH_MIG_STATE",
                    reason: "software cannot set ARMED".into(),
                });
            }
        }
        Ok(())
    }

    /// Swaps to the alternate path: it becomes the primary (the old primary becomes the
    /// alternate, unarmed), retries restart, everything unacknowledged is resent on the new
    /// path, and the application gets `PathMigrated`.
    pub(crate) fn migrate(&mut self, now: u64, res: &mut Resources) {
        let Some(alt) = self.alt_path.take() else {
            return;
        };
        self.alt_path = self.path.replace(alt);
        let a = &mut self.attr;
        std::mem::swap(&mut a.ah_attr, &mut a.alt_ah_attr);
        std::mem::swap(&mut a.port_num, &mut a.alt_port_num);
        std::mem::swap(&mut a.timeout, &mut a.alt_timeout);
        std::mem::swap(&mut a.pkey_index, &mut a.alt_pkey_index);
        a.path_mig_state = MigState::Migrated;
        self.migrations += 1;
        res.events.push_back(AsyncEvent::PathMigrated(self.qpn));
        let attr = self.attr;
        self.req.reload_limits(&attr);
        self.req.restart_on_new_path(now);
    }

    /// Requester retries are used up. Returns true when the QP migrated instead of failing.
    pub(crate) fn migrate_on_retry_exhaustion(&mut self, now: u64, res: &mut Resources) -> bool {
        match self.attr.path_mig_state {
            MigState::Armed if self.alt_path.is_some() => {
                self.migrate(now, res);
                true
            }
            // An alternate was loaded but never armed, or we already migrated and the new
            // path failed too: migration could not help.
            MigState::Rearm => {
                res.events
                    .push_back(AsyncEvent::PathMigrationError(self.qpn));
                false
            }
            _ => {
                if self.migrations > 0 {
                    res.events
                        .push_back(AsyncEvent::PathMigrationError(self.qpn));
                }
                false
            }
        }
    }

    /// The MigReq bit of a packet from the peer: M = 0 while we are REARM means the peer has
    /// loaded its alternate too (-> ARMED); M = 1 while ARMED means the peer has migrated
    /// (follow it).
    pub(crate) fn on_peer_mig_req(&mut self, now: u64, res: &mut Resources, m: bool) {
        match (self.attr.path_mig_state, m) {
            (MigState::Rearm, false) => self.attr.path_mig_state = MigState::Armed,
            (MigState::Armed, true) if self.state() == QpState::Rts => self.migrate(now, res),
            _ => {}
        }
    }

    /// True when a packet from `src` on local port `port` belongs to one of this QP's paths.
    pub(crate) fn on_a_path(&self, port: usize, src: SocketAddr) -> bool {
        [self.path, self.alt_path]
            .into_iter()
            .flatten()
            .any(|p| p.port == port && p.remote.ip() == src.ip())
    }
}

impl Nic {
    /// The driver saw local port `port` (0-based) fail: QPs whose primary path uses it and
    /// whose alternate is ARMED migrate now rather than after their retries run out.
    pub fn handle_port_down(&mut self, now: u64, port: usize) {
        self.timers_dirty = true;
        self.res
            .events
            .push_back(AsyncEvent::PortError(port as u8 + 1));
        for qp in self.qps.values_mut() {
            let on_port = qp.path.is_some_and(|p| p.port == port);
            let armed = qp.attr.path_mig_state == MigState::Armed && qp.alt_path.is_some();
            if on_port
                && armed
                && matches!(qp.qp_type, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
                && qp.state() == QpState::Rts
            {
                qp.migrate(now, &mut self.res);
                if !qp.in_tx_ready && qp.wants_transmit() {
                    qp.in_tx_ready = true;
                    self.tx_ready.push_back(qp.qpn.0);
                }
            }
        }
    }

    /// Local port `port` (0-based) works again.
    pub fn handle_port_up(&mut self, port: usize) {
        self.timers_dirty = true;
        self.res
            .events
            .push_back(AsyncEvent::PortActive(port as u8 + 1));
    }
}
