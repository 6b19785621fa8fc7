//! What the adapter hands out: the tools it offers ([`ToolDefinition`]), a
//! call's outcome ([`ToolOutcome`]), and the record of its decision for the
//! audit log ([`DecisionRecord`]).

use dk_proto::Channel;
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::by::By;

/// A tool definition in the OpenAI function shape that 8DK emits.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// `device__<id>__<capability>`.
    pub name: String,
    /// `[DEVICE <name> (<kind>) <capability kind>] <description>`.
    pub description: String,
    /// JSON Schema of the input: an object of the declared params.
    pub parameters: Value,
    /// The device the tool calls.
    pub device_id: String,
    /// The capability it calls.
    pub capability: String,
    /// Whether the capability only reads (a sensor).
    pub read_only: bool,
    /// Whether the person is asked on every call.
    pub confirm: bool,
}

impl Serialize for ToolDefinition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &Function {
                name: &self.name,
                description: &self.description,
                parameters: &self.parameters,
            },
        )?;
        map.end()
    }
}

/// The `function` of a tool definition: `{name, description, parameters}`.
#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// The outcome of a call, as 8DK returns it: `{ok:true, result}` or `{ok:false, reason}`.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    /// The device answered.
    Ok {
        /// Its result, when it sent one.
        result: Option<Box<RawValue>>,
    },
    /// The call was refused, or the device failed.
    Refused {
        /// Why, in 8DK's words.
        reason: String,
    },
}

impl ToolOutcome {
    /// Whether the device answered with success.
    pub fn is_ok(&self) -> bool {
        matches!(self, ToolOutcome::Ok { .. })
    }

    /// The refusal reason, if refused.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ToolOutcome::Ok { .. } => None,
            ToolOutcome::Refused { reason } => Some(reason),
        }
    }

    /// The result as a JSON value (`None` when refused or absent).
    pub fn result_value(&self) -> Option<Value> {
        match self {
            ToolOutcome::Ok { result: Some(raw) } => serde_json::from_str(raw.get()).ok(),
            _ => None,
        }
    }
}

impl Serialize for ToolOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        match self {
            ToolOutcome::Ok { result } => {
                map.serialize_entry("ok", &true)?;
                if let Some(result) = result {
                    map.serialize_entry("result", result)?;
                }
            }
            ToolOutcome::Refused { reason } => {
                map.serialize_entry("ok", &false)?;
                map.serialize_entry("reason", reason)?;
            }
        }
        map.end()
    }
}

/// One call's decision, for the audit log. `rule` names the `device_use`
/// rule that blocked the call or asked the person, when one did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord<'a> {
    /// The tool name as the agent gave it.
    pub tool: &'a str,
    /// The device id, when the name parsed.
    pub device_id: Option<&'a str>,
    /// The capability, when the name parsed.
    pub capability: Option<&'a str>,
    /// Whether the call reached the device.
    pub allowed: bool,
    /// `allowed`, or why not (the same text the agent sees).
    pub reason: &'a str,
    /// The calling agent.
    pub agent_id: Option<&'a str>,
    /// The calling session.
    pub session_id: Option<&'a str>,
    /// The rule that decided, if any.
    pub rule: Option<&'a str>,
    /// The call's input as the agent gave it (for the audit log, which
    /// redacts and cuts it; not part of 8DK's record).
    #[serde(skip)]
    pub input: Option<&'a Value>,
    /// The person's answer when the call asked for one: `Some(true)` for a
    /// yes, `Some(false)` for a no (or no answer in time); `None` when
    /// nobody was asked. For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub person_answer: Option<bool>,
    /// The call is the person's own (the admin API's), not an agent's.
    #[serde(skip)]
    pub by_person: bool,
    /// The remembered allowance the person's answer made, or that answered
    /// for the person. For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub allowance: Option<AllowanceUse>,
    /// The channel of the paired device the call named, when it named one
    /// (read at check 1). For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub channel: Option<Channel>,
    /// The front end the person answered through, when they were asked and
    /// it says. For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub answered_by: Option<&'a By>,
}

/// How a call met a remembered allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllowanceUse {
    /// The person's answer to this call made allowance `0`.
    Created(u64),
    /// Allowance `0` answered for the person: nobody was asked.
    Used(u64),
}
