//! A checked rule: what a rule file's entry becomes once every key is valid.

use std::fmt;

use crate::condition::Condition;
use crate::error::Location;
use crate::rate::RateLimit;

/// The action name of a device call.
pub const DEVICE_USE: &str = "device_use";

/// What a rule decides when it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleDecision {
    /// `block`: the call is refused.
    Block,
    /// `require_approval`: the person is asked.
    RequireApproval,
    /// `allow`: nothing more is asked (a grant is still needed).
    Allow,
}

impl RuleDecision {
    /// The spelling in a rule file: `block`, `require_approval` or `allow`.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleDecision::Block => "block",
            RuleDecision::RequireApproval => "require_approval",
            RuleDecision::Allow => "allow",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "block" => Some(RuleDecision::Block),
            "require_approval" => Some(RuleDecision::RequireApproval),
            "allow" => Some(RuleDecision::Allow),
            _ => None,
        }
    }

    pub(crate) fn tier(self) -> usize {
        match self {
            RuleDecision::Block => 0,
            RuleDecision::RequireApproval => 1,
            RuleDecision::Allow => 2,
        }
    }
}

impl fmt::Display for RuleDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One checked rule, as read from a rule file.
#[derive(Clone, Debug)]
pub struct Rule {
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) action: String,
    pub(crate) decision: RuleDecision,
    pub(crate) message: String,
    pub(crate) enabled: bool,
    pub(crate) agent_scope: Option<String>,
    pub(crate) condition: Condition,
    pub(crate) condition_text: String,
    pub(crate) environments: Vec<String>,
    pub(crate) immutable: bool,
    pub(crate) limit: Option<RateLimit>,
    pub(crate) location: Option<Location>,
    pub(crate) reason: String,
}

impl Rule {
    /// The rule's index in `policies`, from 0 (file order).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The rule's name, unique in its file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The action it governs (`device_use`, another action name, or `*` for all).
    pub fn action(&self) -> &str {
        &self.action
    }

    /// What it decides when it matches.
    pub fn decision(&self) -> RuleDecision {
        self.decision
    }

    /// Its message, as written.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The reason a decision by this rule carries: `[<name>] <message>`.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// False when the file says `enabled: false`: the rule is then never applied.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The agent id the rule is limited to, if any (an empty `agentScope`
    /// counts as none, as in 8gent).
    pub fn agent_scope(&self) -> Option<&str> {
        self.agent_scope.as_deref()
    }

    /// The checked condition.
    pub fn condition(&self) -> &Condition {
        &self.condition
    }

    /// The condition as written in the file.
    pub fn condition_text(&self) -> &str {
        &self.condition_text
    }

    /// 8gent's `environments`, kept for display. It has no effect in dk.
    pub fn environments(&self) -> &[String] {
        &self.environments
    }

    /// 8gent's `immutable`, kept for display. It has no effect in dk: no
    /// rule can be lifted at run time anyway.
    pub fn is_immutable(&self) -> bool {
        self.immutable
    }

    /// The rule's `limit`, if it has one: it then decides only once the
    /// calling agent has made that many allowed calls matching it within
    /// the window (see [`crate::RateCounts`]).
    pub fn limit(&self) -> Option<RateLimit> {
        self.limit
    }

    /// Where the rule starts in its file, when known. The YAML parser gives
    /// positions only with its errors, so errors carry lines and columns but
    /// the rules of a file that loaded do not: this is `None` for now.
    pub fn location(&self) -> Option<Location> {
        self.location
    }

    /// Whether the rule applies to `action` asked by `agent_id`: enabled,
    /// action equal or `*`, and agent scope absent or equal.
    pub fn applies_to(&self, action: &str, agent_id: Option<&str>) -> bool {
        self.enabled
            && (self.action == action || self.action == "*")
            && match &self.agent_scope {
                None => true,
                Some(scope) => Some(scope.as_str()) == agent_id,
            }
    }
}
