//! Each call's decision as the vessel keeps it: among the recent ones in
//! memory, for listings, and redacted in the audit log.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use dk_proto::Channel;
use serde_json::Value;

use crate::adapter::{AllowanceUse, DecisionRecord};
use crate::by::By;
use crate::redact::SecretRedactor;
use crate::store::entry as schema;
use crate::store::{AuditEvent, AuditText, AuditWriter, Made, fits_in_entry};

/// How many decision records the vessel keeps in memory for listings.
pub(super) const RECENT_DECISIONS: usize = 1000;

/// Keeps each decision: in the recent list, and in the audit log with the
/// call's input (secrets removed, long values cut).
pub(super) struct DecisionAudit {
    pub(super) recent: Arc<Mutex<VecDeque<Arc<Decision>>>>,
    pub(super) writer: Arc<AuditWriter>,
    /// The vessel's redactor: every entry goes through it whole.
    pub(super) redactor: SecretRedactor,
}

/// A decision record owned, taken on the call path: its texts copied into
/// one string (one allocation, freed as one wherever the decision is
/// dropped), the rest as it was, and a clone of the input; building the
/// record, its JSON and redacting happen later, off the path.
#[derive(Debug)]
pub(super) struct Decision {
    at_ms: u64,
    /// The record's texts one after the other; `spans` says where each is.
    texts: String,
    /// Where each of [`Text`]'s fields lies in `texts`, when it was given.
    spans: [Option<(usize, usize)>; Text::COUNT],
    allowed: bool,
    person_answer: Option<bool>,
    allowance: Option<AllowanceUse>,
    by_person: bool,
    channel: Option<Channel>,
    answered_by: Option<By>,
    /// The call's input, as given.
    input: Option<Value>,
}

/// The text fields of a decision record, by their place in
/// [`Decision::spans`].
#[derive(Clone, Copy)]
pub(super) enum Text {
    Tool,
    DeviceId,
    Capability,
    Reason,
    AgentId,
    SessionId,
    Rule,
}

impl Text {
    const COUNT: usize = 7;
}

impl Decision {
    /// Copies what the record borrows, at `at_ms`.
    pub(super) fn of(record: &DecisionRecord<'_>, at_ms: u64) -> Decision {
        let given: [Option<&str>; Text::COUNT] = [
            Some(record.tool),
            record.device_id,
            record.capability,
            Some(record.reason),
            record.agent_id,
            record.session_id,
            record.rule,
        ];
        let mut texts = String::with_capacity(given.iter().flatten().map(|t| t.len()).sum());
        let spans = given.map(|text| {
            text.map(|text| {
                let start = texts.len();
                texts.push_str(text);
                (start, texts.len())
            })
        });
        Decision {
            at_ms,
            texts,
            spans,
            allowed: record.allowed,
            person_answer: record.person_answer,
            allowance: record.allowance,
            by_person: record.by_person,
            channel: record.channel,
            answered_by: record.answered_by.cloned(),
            input: record.input.cloned(),
        }
    }

    /// The text of `field`, when the record had it.
    pub(super) fn text(&self, field: Text) -> Option<&str> {
        let (start, end) = self.spans.get(field as usize).copied().flatten()?;
        self.texts.get(start..end)
    }

    /// The record as the audit schema has it (its input aside).
    pub(super) fn record(&self) -> schema::Decision {
        let owned = |field| self.text(field).map(str::to_owned);
        let (person, allowance) = match self.allowance {
            Some(AllowanceUse::Used(id)) => (
                Some(schema::PersonAnswer::Remembered),
                Some(schema::AllowanceRef { id, created: false }),
            ),
            made => (
                self.person_answer.map(|yes| {
                    if yes {
                        schema::PersonAnswer::Approved
                    } else {
                        schema::PersonAnswer::Refused
                    }
                }),
                match made {
                    Some(AllowanceUse::Created(id)) => {
                        Some(schema::AllowanceRef { id, created: true })
                    }
                    _ => None,
                },
            ),
        };
        schema::Decision {
            tool: owned(Text::Tool).unwrap_or_default(),
            device_id: owned(Text::DeviceId),
            capability: owned(Text::Capability),
            allowed: self.allowed,
            reason: owned(Text::Reason).unwrap_or_default(),
            agent_id: owned(Text::AgentId),
            session_id: owned(Text::SessionId),
            rule: owned(Text::Rule),
            person,
            allowance,
            caller: self.by_person.then_some(schema::Caller::Person),
            channel: self.channel.map(|channel| channel.as_str().to_owned()),
            by: self.answered_by.clone(),
            input: None,
        }
    }

    /// The record as 8DK's shape (plus `rule`), without the input; with
    /// `person` (`approved` or `refused`) when the person was asked, and
    /// `caller: "person"` for the person's own call.
    pub(super) fn to_json(&self) -> Value {
        serde_json::to_value(self.record()).unwrap_or(Value::Null)
    }

    /// What the decision's audit entry is made of on the writer thread: its
    /// text written straight from the record, redacted field by field, when
    /// the record allows (see [`SecretRedactor::redact_decision_for_audit`])
    /// and the entry fits; else [`Decision::audit_event`]. Both give the
    /// same entry.
    pub(super) fn audit_made(&self, redactor: &SecretRedactor) -> Made {
        let mut record = self.record();
        if redactor.redact_decision_for_audit(&mut record) {
            record.input = self
                .input
                .as_ref()
                .map(|input| redactor.redact_for_audit(input));
            if let Ok(text) = AuditText::decision(self.at_ms, &record) {
                return Made::Text(text);
            }
        }
        Made::Event(self.audit_event(redactor))
    }

    /// The decision's audit event: the record and its input, each redacted
    /// and cut by [`SecretRedactor::redact_for_audit`]. An input whose cut
    /// form would still make the entry too large to store (wide nesting,
    /// escapes) is replaced by a marker giving its size: the decision itself
    /// is always recorded.
    pub(super) fn audit_event(&self, redactor: &SecretRedactor) -> AuditEvent {
        let mut entry = redactor.redact_owned_for_audit(self.to_json());
        if let (Some(input), Value::Object(map)) = (&self.input, &mut entry) {
            map.insert(
                schema::fields::INPUT.to_owned(),
                redactor.redact_for_audit(input),
            );
        }
        if !fits_in_entry(&entry)
            && let Value::Object(map) = &mut entry
            && let Some(input) = map.get_mut(schema::fields::INPUT)
        {
            *input = schema::Decision::input_cut(input.to_string().len());
        }
        AuditEvent {
            at_ms: self.at_ms,
            kind: schema::kinds::DECISION.to_owned(),
            entry,
        }
    }
}

/// The audit event of an entry of `kind` with these details, happening
/// now, every known secret in it redacted.
pub(super) fn redacted_event(kind: &str, entry: &Value, redactor: &SecretRedactor) -> AuditEvent {
    AuditEvent {
        at_ms: crate::registry::epoch_ms(std::time::SystemTime::now()),
        kind: kind.to_owned(),
        entry: redactor.redact_json(entry),
    }
}

impl DecisionAudit {
    pub(super) fn record(&self, record: &DecisionRecord<'_>) {
        let decision = Arc::new(Decision::of(
            record,
            crate::registry::epoch_ms(std::time::SystemTime::now()),
        ));
        let evicted = {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            let evicted = if recent.len() >= RECENT_DECISIONS {
                recent.pop_front()
            } else {
                None
            };
            recent.push_back(Arc::clone(&decision));
            evicted
        };
        let redactor = self.redactor.clone();
        // The adapter took this decision's place in the queue before the
        // call's checks. The decision that made room goes with it: freeing
        // its strings and input is the writer thread's work, not the call's.
        self.writer.record_placed(move || {
            drop(evicted);
            Some(decision.audit_made(&redactor))
        });
    }
}
