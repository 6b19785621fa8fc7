//! Presence: which member holds which device, kept from what members say
//! on [`PRESENCE_SUBJECT`](crate::PRESENCE_SUBJECT), without IO.
//!
//! A member's set of devices has a version, raised by every change. Every
//! beat says the version (a few bytes, however many devices); a change is
//! said as a delta from one version to the next; a receiver whose version
//! does not follow (it joined late, missed a message, or the member
//! restarted) asks the member for the whole set ([`View::wants`]). A beat
//! of 10,000 devices is as small as a beat of one.
//!
//! Each member runs as an [`Incarnation`]: a beat from a later one means
//! the member restarted, and what an earlier one says is stale.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::member::{Incarnation, MemberId};

/// Most devices one member's presence holds: what a member announces or
/// says beyond it is cut.
pub const MAX_DEVICES: usize = 65_536;

/// What a member says on the presence subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "camelCase", deny_unknown_fields)]
pub(crate) enum Said {
    /// A heartbeat: the version of the set held, and its size.
    Beat { version: u64, count: u64 },
    /// The set changed from version `from` to `to`.
    Delta {
        from: u64,
        to: u64,
        added: Vec<String>,
        removed: Vec<String>,
    },
    /// The member is leaving: forget it at once.
    Goodbye,
}

/// A member's whole set, as it answers a request for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Whole {
    pub(crate) version: u64,
    pub(crate) devices: Vec<String>,
}

/// A change in who is present, for whoever keeps state per member (the
/// prompts it raised, say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresenceChange {
    /// A member was heard for the first time, or again after it had left.
    Joined {
        /// Who.
        member: MemberId,
        /// As which incarnation.
        incarnation: Incarnation,
    },
    /// A member was heard as a later incarnation: it restarted, and
    /// nothing its earlier one held or asked stands.
    Restarted {
        /// Who.
        member: MemberId,
        /// The incarnation it runs as now.
        incarnation: Incarnation,
        /// The incarnation that is gone.
        was: Incarnation,
    },
    /// A member left: it said goodbye, or was not heard within the expiry.
    Left {
        /// Who.
        member: MemberId,
        /// The incarnation that left.
        incarnation: Incarnation,
        /// Whether it said goodbye (else it went silent).
        goodbye: bool,
    },
}

/// One member's presence as heard here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The member.
    pub member: MemberId,
    /// The incarnation it runs as.
    pub incarnation: Incarnation,
    /// How many devices it holds, as last heard.
    pub devices: usize,
    /// How long ago it was last heard.
    pub heard_ago: Duration,
}

/// A member that left, as heard here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    /// The member.
    pub member: MemberId,
    /// The incarnation that left.
    pub incarnation: Incarnation,
    /// Whether it said goodbye (else it went silent past the expiry).
    pub goodbye: bool,
    /// How long ago it left.
    pub ago: Duration,
}

/// How a member left, and when.
#[derive(Debug, Clone, Copy)]
struct Leaving {
    incarnation: Incarnation,
    goodbye: bool,
    at: Instant,
}

/// What one member's presence holds here.
struct Holding {
    incarnation: Incarnation,
    /// The version `devices` is at; `None` until the whole set is read.
    version: Option<u64>,
    /// The version its last beat or delta said.
    said: u64,
    devices: HashSet<String>,
    heard: Instant,
}

/// Every other member's presence, from what they said.
pub(crate) struct View {
    members: BTreeMap<MemberId, Holding>,
    /// The latest incarnation seen of members that left, and how, so a
    /// message of theirs replayed afterwards is not taken for a new start.
    left: BTreeMap<MemberId, Leaving>,
    expiry: Duration,
}

/// What a message said to the view means.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Heard {
    /// The change in presence it made, if any.
    pub(crate) change: Option<PresenceChange>,
    /// Whether the member's whole set should be asked for.
    pub(crate) ask_whole: bool,
    /// Whether the message was from an incarnation already gone.
    pub(crate) stale: bool,
}

impl View {
    pub(crate) fn new(expiry: Duration) -> View {
        View {
            members: BTreeMap::new(),
            left: BTreeMap::new(),
            expiry,
        }
    }

    /// Whether a message from `member` as `incarnation` comes from one
    /// that is gone (an earlier incarnation than the one heard last).
    pub(crate) fn is_stale(&self, member: &MemberId, incarnation: Incarnation) -> bool {
        let current = self
            .members
            .get(member)
            .map(|h| h.incarnation)
            .or_else(|| self.left.get(member).map(|l| l.incarnation));
        current.is_some_and(|current| incarnation < current)
    }

    /// Takes what `member`, as `incarnation`, said at `now`.
    pub(crate) fn hear(
        &mut self,
        member: &MemberId,
        incarnation: Incarnation,
        said: Said,
        now: Instant,
    ) -> Heard {
        if self.is_stale(member, incarnation) {
            return Heard {
                stale: true,
                ..Heard::default()
            };
        }
        if said == Said::Goodbye {
            let change = self.leave(member, true);
            self.left.insert(
                member.clone(),
                Leaving {
                    incarnation,
                    goodbye: true,
                    at: now,
                },
            );
            return Heard {
                change,
                ..Heard::default()
            };
        }
        if self
            .left
            .get(member)
            .is_some_and(|l| l.goodbye && l.incarnation == incarnation)
        {
            // Said goodbye as this incarnation: a later word of it is a
            // delayed or replayed one. (One that went silent may come back:
            // a paused process, a network cut.)
            return Heard {
                stale: true,
                ..Heard::default()
            };
        }
        let mut change = None;
        let current = self.members.get(member).map(|h| h.incarnation);
        if current != Some(incarnation) {
            change = Some(match current {
                Some(was) => PresenceChange::Restarted {
                    member: member.clone(),
                    incarnation,
                    was,
                },
                None => PresenceChange::Joined {
                    member: member.clone(),
                    incarnation,
                },
            });
            self.left.remove(member);
            self.members.insert(
                member.clone(),
                Holding {
                    incarnation,
                    version: None,
                    said: 0,
                    devices: HashSet::new(),
                    heard: now,
                },
            );
        }
        let Some(holding) = self.members.get_mut(member) else {
            return Heard::default();
        };
        holding.heard = now;
        let ask_whole = match said {
            Said::Beat { version, .. } => {
                holding.said = holding.said.max(version);
                holding.version != Some(version)
            }
            Said::Delta {
                from,
                to,
                added,
                removed,
            } => {
                holding.said = holding.said.max(to);
                if holding.version == Some(from) && to > from {
                    for device in removed {
                        holding.devices.remove(&device);
                    }
                    for device in added {
                        if holding.devices.len() < MAX_DEVICES {
                            holding.devices.insert(device);
                        }
                    }
                    holding.version = Some(to);
                    false
                } else {
                    holding.version.is_none_or(|v| v < to)
                }
            }
            Said::Goodbye => false,
        };
        Heard {
            change,
            ask_whole,
            stale: false,
        }
    }

    /// Takes `member`'s whole set, read as `incarnation`, when it is newer
    /// than what is held.
    pub(crate) fn take_whole(&mut self, member: &MemberId, incarnation: Incarnation, whole: Whole) {
        let Some(held) = self.members.get_mut(member) else {
            return;
        };
        if held.incarnation != incarnation || held.version.is_some_and(|v| v >= whole.version) {
            return;
        }
        held.devices = whole.devices.into_iter().take(MAX_DEVICES).collect();
        held.version = Some(whole.version);
    }

    /// Whether `member`'s set is behind what it said (a whole set to ask
    /// for again, after an answer that did not come).
    #[cfg(test)]
    pub(crate) fn behind(&self, member: &MemberId) -> bool {
        self.members
            .get(member)
            .is_some_and(|h| h.version.is_none_or(|v| v < h.said))
    }

    /// Forgets the members not heard within the expiry at `now`: the
    /// changes that makes.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<PresenceChange> {
        let gone: Vec<MemberId> = self
            .members
            .iter()
            .filter(|(_, h)| now.saturating_duration_since(h.heard) > self.expiry)
            .map(|(m, _)| m.clone())
            .collect();
        gone.iter()
            .filter_map(|member| {
                let incarnation = self.members.get(member).map(|h| h.incarnation);
                let change = self.leave(member, false);
                if let Some(incarnation) = incarnation {
                    self.left.insert(
                        member.clone(),
                        Leaving {
                            incarnation,
                            goodbye: false,
                            at: now,
                        },
                    );
                }
                change
            })
            .collect()
    }

    /// When the next member expires, if any is present.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        self.members.values().map(|h| h.heard + self.expiry).min()
    }

    fn leave(&mut self, member: &MemberId, goodbye: bool) -> Option<PresenceChange> {
        let held = self.members.remove(member)?;
        Some(PresenceChange::Left {
            member: member.clone(),
            incarnation: held.incarnation,
            goodbye,
        })
    }

    /// The present member holding `device`: the one heard last, when two
    /// say so (a device that moved, while the member it left goes silent).
    pub(crate) fn holder_of(&self, device: &str) -> Option<(MemberId, Incarnation)> {
        self.members
            .iter()
            .filter(|(_, h)| h.devices.contains(device))
            .max_by_key(|(_, h)| h.heard)
            .map(|(m, h)| (m.clone(), h.incarnation))
    }

    /// Whether `member`'s `incarnation` left saying goodbye (it serves
    /// nothing more), as opposed to going silent (it may be paused, and
    /// come back).
    pub(crate) fn said_goodbye(&self, member: &MemberId, incarnation: Incarnation) -> bool {
        self.left
            .get(member)
            .is_some_and(|l| l.goodbye && l.incarnation == incarnation)
    }

    /// The incarnation `member` is present as, if it is.
    pub(crate) fn incarnation_of(&self, member: &MemberId) -> Option<Incarnation> {
        self.members.get(member).map(|h| h.incarnation)
    }

    /// The members that left and are not back, in order.
    pub(crate) fn departed(&self, now: Instant) -> Vec<Departed> {
        self.left
            .iter()
            .filter(|(member, _)| !self.members.contains_key(*member))
            .map(|(member, l)| Departed {
                member: member.clone(),
                incarnation: l.incarnation,
                goodbye: l.goodbye,
                ago: now.saturating_duration_since(l.at),
            })
            .collect()
    }

    /// Every present member, in order.
    pub(crate) fn seen(&self, now: Instant) -> Vec<Seen> {
        self.members
            .iter()
            .map(|(member, h)| Seen {
                member: member.clone(),
                incarnation: h.incarnation,
                devices: h.devices.len(),
                heard_ago: now.saturating_duration_since(h.heard),
            })
            .collect()
    }
}

/// This member's own set and its version.
#[derive(Default)]
pub(crate) struct Held {
    pub(crate) devices: BTreeSet<String>,
    pub(crate) version: u64,
}

impl Held {
    /// Makes `devices` the set held: the deltas that say it (none when
    /// nothing changed), each within `room` bytes of ids, one version each.
    pub(crate) fn replace(&mut self, devices: BTreeSet<String>, room: usize) -> Vec<Said> {
        let added: Vec<String> = devices.difference(&self.devices).cloned().collect();
        let removed: Vec<String> = self.devices.difference(&devices).cloned().collect();
        self.devices = devices;
        let mut deltas = Vec::new();
        let mut pieces = pieces(removed, room)
            .map(|r| (Vec::new(), r))
            .chain(pieces(added, room).map(|a| (a, Vec::new())));
        for (added, removed) in pieces.by_ref() {
            let from = self.version;
            self.version += 1;
            deltas.push(Said::Delta {
                from,
                to: self.version,
                added,
                removed,
            });
        }
        deltas
    }

    /// The beat saying this set.
    pub(crate) fn beat(&self) -> Said {
        Said::Beat {
            version: self.version,
            count: u64::try_from(self.devices.len()).unwrap_or(u64::MAX),
        }
    }

    /// The whole set.
    pub(crate) fn whole(&self) -> Whole {
        Whole {
            version: self.version,
            devices: self.devices.iter().cloned().collect(),
        }
    }
}

/// `ids` in runs of at most `room` bytes (as JSON strings, roughly), one
/// id at least in each.
fn pieces(ids: Vec<String>, room: usize) -> impl Iterator<Item = Vec<String>> {
    let mut runs: Vec<Vec<String>> = Vec::new();
    let mut used = 0;
    for id in ids {
        let size = id.len() + 4;
        match runs.last_mut() {
            Some(run) if used + size <= room => run.push(id),
            _ => {
                runs.push(vec![id]);
                used = 0;
            }
        }
        used += size;
    }
    runs.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> MemberId {
        MemberId::new(name).unwrap()
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn deltas_follow_and_a_gap_asks_for_the_whole() {
        let now = Instant::now();
        let mut view = View::new(Duration::from_secs(3));
        let mut held = Held::default();
        let a = member("a");
        let inc = Incarnation::from_parts(1, 1);
        // A first beat: a member joined, its whole set to be read.
        let heard = view.hear(&a, inc, held.beat(), now);
        assert_eq!(
            heard.change,
            Some(PresenceChange::Joined {
                member: a.clone(),
                incarnation: inc
            })
        );
        assert!(heard.ask_whole);
        view.take_whole(&a, inc, held.whole());
        assert!(!view.behind(&a));
        // Deltas in order are applied.
        for said in held.replace(set(&["lamp", "lock"]), 1024) {
            assert!(!view.hear(&a, inc, said, now).ask_whole);
        }
        assert_eq!(view.holder_of("lamp"), Some((a.clone(), inc)));
        // A delta missed: the next one asks for the whole set.
        let _missed = held.replace(set(&["lamp"]), 1024);
        let next = held.replace(set(&["lamp", "fan"]), 1024);
        for said in next {
            assert!(view.hear(&a, inc, said, now).ask_whole);
        }
        assert!(view.behind(&a));
        view.take_whole(&a, inc, held.whole());
        assert_eq!(view.holder_of("lock"), None);
        assert_eq!(view.holder_of("fan"), Some((a.clone(), inc)));
        assert!(!view.hear(&a, inc, held.beat(), now).ask_whole);
        // An older whole set does not undo a newer one.
        view.take_whole(
            &a,
            inc,
            Whole {
                version: 1,
                devices: vec!["lock".into()],
            },
        );
        assert_eq!(view.holder_of("lock"), None);
    }

    #[test]
    fn a_restart_goodbye_and_silence_are_told_and_stale_words_dropped() {
        let now = Instant::now();
        let mut view = View::new(Duration::from_secs(3));
        let a = member("a");
        let (first, second) = (Incarnation::from_parts(1, 5), Incarnation::from_parts(2, 1));
        let beat = Said::Beat {
            version: 0,
            count: 0,
        };
        view.hear(&a, first, beat.clone(), now);
        let heard = view.hear(&a, second, beat.clone(), now);
        assert_eq!(
            heard.change,
            Some(PresenceChange::Restarted {
                member: a.clone(),
                incarnation: second,
                was: first
            })
        );
        // The earlier incarnation's words are stale now.
        assert!(view.hear(&a, first, beat.clone(), now).stale);
        assert_eq!(view.incarnation_of(&a), Some(second));
        // Goodbye: gone at once, and a replayed beat of it stays stale.
        let heard = view.hear(&a, second, Said::Goodbye, now);
        assert_eq!(
            heard.change,
            Some(PresenceChange::Left {
                member: a.clone(),
                incarnation: second,
                goodbye: true
            })
        );
        assert!(view.hear(&a, second, beat.clone(), now).stale);
        assert!(view.hear(&a, first, beat.clone(), now).stale);
        // A new start is heard again.
        let third = Incarnation::from_parts(3, 1);
        assert!(matches!(
            view.hear(&a, third, beat, now).change,
            Some(PresenceChange::Joined { .. })
        ));
        // Silence past the expiry: gone.
        assert_eq!(view.expire(now + Duration::from_secs(2)), vec![]);
        let later = now + Duration::from_secs(4);
        assert_eq!(
            view.expire(later),
            vec![PresenceChange::Left {
                member: a.clone(),
                incarnation: third,
                goodbye: false
            }]
        );
        assert!(view.seen(later).is_empty());
        assert!(!view.departed(later)[0].goodbye);
        // Back from the silence (it was paused): joined again.
        let beat = Said::Beat {
            version: 0,
            count: 0,
        };
        assert!(matches!(
            view.hear(&a, third, beat, later).change,
            Some(PresenceChange::Joined { .. })
        ));
        assert!(view.departed(later).is_empty());
    }

    #[test]
    fn ten_thousand_devices_in_deltas_within_the_room() {
        let mut held = Held::default();
        let devices: BTreeSet<String> = (0..10_000).map(|n| format!("device-{n:017}")).collect();
        let room = 64 * 1024;
        let deltas = held.replace(devices.clone(), room);
        assert!(deltas.len() > 1);
        let mut view = View::new(Duration::from_secs(3));
        let (a, inc, now) = (member("a"), Incarnation::from_parts(1, 1), Instant::now());
        view.hear(
            &a,
            inc,
            Said::Beat {
                version: 0,
                count: 0,
            },
            now,
        );
        view.take_whole(
            &a,
            inc,
            Whole {
                version: 0,
                devices: vec![],
            },
        );
        // take_whole of version 0 over None: held at 0, deltas follow.
        for said in deltas {
            let bytes = serde_json::to_vec(&said).unwrap();
            assert!(bytes.len() <= room + 200, "{}", bytes.len());
            assert!(!view.hear(&a, inc, said, now).ask_whole);
        }
        assert_eq!(view.seen(now)[0].devices, 10_000);
        assert!(serde_json::to_vec(&held.beat()).unwrap().len() < 64);
    }
}
