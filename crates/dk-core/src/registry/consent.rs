//! What the person is asked when a device pairs ([`ConsentRequest`], with
//! each capability as [`ConsentCapability`] and, for a device paired again,
//! what changed), and what they answer ([`ConsentDecision`]).

use dk_proto::admin::{CapabilityChange, ChangeKind, CredentialChange, Difference, Replaced};
use dk_proto::{CapabilityKind, Channel, Manifest};
use dk_store::epoch_ms;
use serde::Serialize;
use subtle::ConstantTimeEq;

use super::state::DeviceRegistry;
use crate::by::By;

/// One capability as the person sees it when asked to pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsentCapability {
    /// Capability name.
    pub name: String,
    /// Sensor or actuator.
    pub kind: CapabilityKind,
    /// What it does, in the device's words (validated text).
    pub description: String,
    /// Whether the person is asked on every call.
    pub confirm: bool,
    /// Its params, each with its bounds in words when declared.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<dk_proto::admin::DeviceParam>,
    /// Its title (the dk manifest extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the device claims of it (its annotations), never checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
}

impl ConsentCapability {
    /// `capability` as the person is asked about it.
    pub fn of(capability: &dk_proto::Capability) -> ConsentCapability {
        let shown = dk_proto::admin::DeviceCapability::of(capability);
        ConsentCapability {
            name: shown.name,
            kind: capability.kind(),
            description: shown.description,
            confirm: shown.confirm,
            params: shown.params,
            title: shown.title,
            claims: shown.claims,
        }
    }
}

/// What the person is asked when a device wants to pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsentRequest {
    /// The device id.
    pub device_id: String,
    /// Its display name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// The code the device is showing: the person checks they match.
    pub code: String,
    /// Every capability the device declares.
    pub capabilities: Vec<ConsentCapability>,
    /// The events the device declares (the dk manifest extension), which
    /// the person grants as capabilities.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<dk_proto::admin::DeclaredEvent>,
    /// The pairing this one would replace, when the id is already paired.
    pub replaces: Option<Box<Replaced>>,
    /// The device says it cannot display the code: nothing proves it is the
    /// device in front of the person, who must confirm that knowingly.
    pub no_screen: bool,
    /// The channel the device asks on: dk/2 (encrypted, the code computed on
    /// both sides) or v1 (in clear, the code sent to the device).
    pub channel: Channel,
}

/// How `new` differs from the approved `old`, capability by capability.
pub(super) fn capability_changes(old: &Manifest, new: &Manifest) -> Vec<CapabilityChange> {
    let mut changes = Vec::new();
    for cap in new.capabilities() {
        let Some(was) = old.capability(cap.name()) else {
            changes.push(CapabilityChange::new(
                cap.name(),
                ChangeKind::Added,
                Vec::new(),
            ));
            continue;
        };
        let mut differences = Vec::new();
        if was.kind() != cap.kind() {
            differences.push(Difference::Kind {
                was: was.kind(),
                now: cap.kind(),
            });
        }
        if was.confirm() != cap.confirm() {
            differences.push(Difference::Confirm {
                was: was.confirm(),
                now: cap.confirm(),
            });
        }
        if was.params() != cap.params() {
            differences.push(Difference::Params);
        }
        if was.description() != cap.description() {
            differences.push(Difference::Description);
        }
        if was.title() != cap.title() {
            differences.push(Difference::Title);
        }
        if was.annotations() != cap.annotations() {
            differences.push(Difference::Claims);
        }
        if was.declared_input_schema() != cap.declared_input_schema()
            || was.output_schema() != cap.output_schema()
        {
            differences.push(Difference::Schema);
        }
        if was.tool() != cap.tool() {
            differences.push(Difference::Tool);
        }
        if !differences.is_empty() {
            changes.push(CapabilityChange::new(
                cap.name(),
                ChangeKind::Changed,
                differences,
            ));
        }
    }
    for was in old.capabilities() {
        if new.capability(was.name()).is_none() {
            changes.push(CapabilityChange::new(
                was.name(),
                ChangeKind::Removed,
                Vec::new(),
            ));
        }
    }
    // Declared events (the dk manifest extension), granted as capabilities
    // are: one added, removed or changed is told the same way.
    for event in new.events() {
        match old.event(event.name()) {
            None => changes.push(CapabilityChange::new(
                event.name(),
                ChangeKind::Added,
                Vec::new(),
            )),
            Some(was) => {
                let mut differences = Vec::new();
                if was.params() != event.params() {
                    differences.push(Difference::Params);
                }
                if was.description() != event.description() {
                    differences.push(Difference::Description);
                }
                if !differences.is_empty() {
                    changes.push(CapabilityChange::new(
                        event.name(),
                        ChangeKind::Changed,
                        differences,
                    ));
                }
            }
        }
    }
    for was in old.events() {
        if new.event(was.name()).is_none() {
            changes.push(CapabilityChange::new(
                was.name(),
                ChangeKind::Removed,
                Vec::new(),
            ));
        }
    }
    changes
}

/// The person's answer to a [`ConsentRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsentDecision {
    /// Yes or no.
    pub approved: bool,
    /// Capabilities the person grants; empty means none.
    pub grant: Vec<String>,
    /// For a device that cannot show a code: the person confirms pairing
    /// without the code check. A yes without it pairs nothing.
    pub confirmed_without_code: bool,
    /// Who answered (the pairing's audit entry names it), when a front
    /// end says.
    pub by: Option<By>,
    /// For a re-pairing whose credential changed (another dk/2 key, or v1
    /// where it was paired over dk/2): the person confirms it knowingly.
    /// A yes without it pairs nothing.
    pub confirmed_credential_change: bool,
}

impl ConsentDecision {
    /// A yes granting `grant`.
    pub fn approve<I: IntoIterator<Item = S>, S: Into<String>>(grant: I) -> ConsentDecision {
        ConsentDecision {
            approved: true,
            grant: grant.into_iter().map(Into::into).collect(),
            confirmed_without_code: false,
            by: None,
            confirmed_credential_change: false,
        }
    }

    /// The same answer, given through `by`.
    pub fn by(mut self, by: By) -> ConsentDecision {
        self.by = Some(by);
        self
    }

    /// The same answer, also confirming that the device's credential
    /// changed ([`Replaced::credential`]).
    pub fn credential_change_confirmed(mut self) -> ConsentDecision {
        self.confirmed_credential_change = true;
        self
    }

    /// The same answer, also confirming a device that cannot show a code.
    pub fn without_code_confirmed(mut self) -> ConsentDecision {
        self.confirmed_without_code = true;
        self
    }

    /// A no.
    pub fn refuse() -> ConsentDecision {
        ConsentDecision::default()
    }
}

impl DeviceRegistry {
    /// What pairing `device_id` again would replace.
    pub(super) fn replaced(&self, new: &Manifest, key: Option<&[u8; 32]>) -> Option<Replaced> {
        self.read().get(new.id()).map(|e| {
            let old = &e.device.manifest;
            let credential = match (&e.device.key, key) {
                (Some(pinned), Some(key)) if !bool::from(pinned.ct_eq(key)) => {
                    Some(CredentialChange::KeyChanged)
                }
                (Some(_), None) => Some(CredentialChange::EncryptionDropped),
                _ => None,
            };
            Replaced {
                credential,
                paired_at_ms: epoch_ms(e.device.paired_at),
                grants: e.grants.iter().cloned().collect(),
                was_name: (old.name() != new.name()).then(|| old.name().to_owned()),
                was_kind: (old.kind() != new.kind()).then(|| old.kind().to_owned()),
                changes: capability_changes(old, new),
            }
        })
    }
}
