//! The seven checks a call passes before its device sees it, in
//! ARCHITECTURE.md's order, each a function: `run_checks` calls them one
//! after the other, and what each found is kept for the record.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use dk_policy::{Call, Decision, DeviceUseContext};
use dk_proto::{AskReason, Capability, InvokeError, Refusal, check_input};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::approval::{Approval, ApprovalRequest};
use super::counts;
use super::pending::Progress;
use super::record::AllowanceUse;
use super::types::{CallContext, DeviceToolAdapter};
use crate::allowances::OfferedCall;
use crate::by::By;
use crate::registry::PairedDevice;

impl DeviceToolAdapter {
    /// The refusal of a call whose agent (one of `ctx`'s gate's, as
    /// `before` says) was removed, or may no longer call the tool, while the
    /// person was asked.
    pub(super) fn agent_gone(
        &self,
        ctx: &CallContext<'_>,
        before: Option<bool>,
        tool: &str,
        device_id: &str,
        capability: &str,
        read_only: bool,
    ) -> Option<Refusal> {
        let (Some(gate), Some(agent)) = (ctx.agent_gate, ctx.agent_id) else {
            return None;
        };
        (before.is_some() && gate.may_call(agent, device_id, capability, read_only) != Some(true))
            .then(|| Refusal::AgentGone {
                agent: agent.to_owned(),
                tool: tool.to_owned(),
            })
    }

    /// Check 5: a live allowance for the call answers for the person;
    /// else the person is asked, and may remember a yes when the call
    /// names an agent that may still make it. A call that opens a voice
    /// device's microphone is asked saying for how long, and a yes to it
    /// is remembered, or a remembered one used, only while an `allow`
    /// rule names the call: the person's rules must say so explicitly.
    pub(super) async fn ask_person(
        &self,
        ctx: &CallContext<'_>,
        asking: Asking<'_>,
        said: &mut PersonSaid,
    ) -> Result<(), Refusal> {
        let Asking {
            tool,
            device_id,
            capability,
            device,
            read_only,
            input,
            reason,
            stamp,
            gate_before,
            allow_rule,
        } = asking;
        let allowances = self.registry.allowances();
        let microphone = crate::microphones::opens_microphone(device.manifest(), capability)
            .then(|| dk_proto::admin::MicrophoneRequest::of(input));
        let rememberable = microphone.is_none() || allow_rule;
        // The person's own calls are theirs; only an agent's are remembered.
        let agent = ctx.agent_id.filter(|_| !ctx.by_person && rememberable);
        if let Some(agent) = agent
            && let Some(id) = allowances.covering(agent, tool, device.generation(), input)
        {
            said.allowance = Some(AllowanceUse::Used(id));
            return Ok(());
        }
        let Some(approver) = ctx.approver else {
            return Err(Refusal::NoApprover {
                reason: reason.into_owned(),
            });
        };
        // Offered only while the agent may make the call and the pairing and
        // grant read before are still those in force.
        let agent_may = ctx.agent_gate.is_none() || gate_before == Some(true);
        let offer = agent
            .filter(|_| {
                agent_may
                    && self
                        .registry
                        .get_with_grant(device_id, capability)
                        .is_some_and(|(now, granted)| {
                            granted && now.generation() == device.generation()
                        })
            })
            .map(|agent_id| {
                allowances.offer(
                    stamp,
                    OfferedCall {
                        agent_id,
                        tool,
                        device_id,
                        capability,
                        generation: device.generation(),
                        read_only,
                        arguments: input,
                    },
                )
            });
        let request = ApprovalRequest {
            tool: tool.to_owned(),
            device_id: device_id.to_owned(),
            capability: capability.to_owned(),
            input: input.clone(),
            reason: reason.clone().into_owned(),
            agent_id: ctx.agent_id.map(str::to_owned),
            session_id: ctx.session_id.map(str::to_owned),
            channel: device.channel(),
            microphone,
        };
        let answered = approver.approve_answered(request, offer).await.map(|a| {
            said.by = a.by;
            a.approval
        });
        match answered {
            Ok(Approval::Once) => said.answer = Some(true),
            Ok(Approval::Remembered(allowance)) => {
                said.answer = Some(true);
                said.allowance = Some(AllowanceUse::Created(allowance.id));
            }
            Ok(Approval::Refused) => {
                said.answer = Some(false);
                // A prompt withdrawn because its agent was removed or
                // re-scoped reads as a no: say why.
                return Err(self
                    .agent_gone(ctx, gate_before, tool, device_id, capability, read_only)
                    .unwrap_or_else(|| Refusal::PersonSaidNo {
                        reason: reason.into_owned(),
                    }));
            }
            Err(why) => {
                return Err(Refusal::NotAsked {
                    why: why.to_string(),
                    reason: reason.into_owned(),
                });
            }
        }
        Ok(())
    }

    /// Checks 1 to 7, in ARCHITECTURE.md's order, each a function below.
    /// `rule` is set to the name of the rule that blocked the call or asked
    /// the person; `progress` is told what check 1 found and, just before
    /// the device is sent the call, that it is reached.
    pub(super) async fn run_checks(
        &self,
        tool: &str,
        parsed: Option<(&str, &str)>,
        input: &Value,
        ctx: &CallContext<'_>,
        (rule, person): (&mut Option<String>, &mut PersonSaid),
        progress: &Progress,
    ) -> Result<Checked, Refusal> {
        // 1. A real device and capability.
        let (device_id, capability) = parsed.ok_or_else(|| Refusal::NotADeviceTool {
            tool: tool.to_owned(),
        })?;
        let (device, granted) = self.paired(device_id, capability)?;
        let _ = progress.channel.set(device.channel());
        let cap = declared(&device, device_id, capability)?;
        let _ = progress.kind.set(cap.kind());
        // 2. Granted by the person.
        check_granted(granted, device_id, capability)?;
        // 3. Rules.
        let Ruled {
            counted,
            ask,
            allow_rule,
        } = self.check_rules(ctx, (device_id, &device), cap, input, rule)?;
        // 4. Well-formed input; then the agent's rate and the call's run.
        let input = check_well_formed(cap, input)?;
        self.charge(ctx, device_id).await?;
        // 5. The person's yes, or an allowance the person gave for it.
        let target = Target {
            tool,
            device_id,
            capability,
            device: &device,
            read_only: cap.kind() == dk_proto::CapabilityKind::Sensor,
        };
        let asked = Asked {
            reason: ask,
            allow_rule,
        };
        let gate_before = self
            .ask_if_asked(ctx, &target, input, asked, person)
            .await?;
        // 6. Still the same pairing, still granted, the agent still there.
        if let Some(gate_before) = gate_before {
            self.check_unchanged(ctx, &target, gate_before)?;
        }
        // 7. Connected and answering.
        self.call_device(
            ctx,
            device_id,
            capability,
            input,
            counted,
            &progress.reached,
        )
        .await
    }

    /// Check 1: the device the tool names, paired, and whether the person
    /// granted the capability (read together, once).
    #[inline]
    pub(super) fn paired(
        &self,
        device_id: &str,
        capability: &str,
    ) -> Result<(Arc<PairedDevice>, bool), Refusal> {
        self.registry
            .get_with_grant(device_id, capability)
            .ok_or_else(|| Refusal::NotPaired {
                device_id: device_id.to_owned(),
            })
    }

    /// Check 3: the rules. A block refuses the call (saying when a limited
    /// rule allows the next one); an ask, or a capability that asks every
    /// time, gives the reason the person will be asked. The calls counted
    /// by rules with a limit are given back unless kept at check 7.
    #[inline]
    pub(super) fn check_rules(
        &self,
        ctx: &CallContext<'_>,
        (device_id, device): (&str, &PairedDevice),
        cap: &Capability,
        input: &Value,
        rule: &mut Option<String>,
    ) -> Result<Ruled<'_>, Refusal> {
        let policies = self.policies();
        let capability = cap.name();
        let call = Call {
            device: DeviceUseContext {
                agent_id: ctx.agent_id,
                session_id: ctx.session_id,
                device_id,
                capability,
                capability_kind: cap.kind().as_str(),
            },
            // Checked only by check 4: a param of the wrong type, or input
            // that is not an object, makes `input.` clauses false.
            input: input.as_object(),
            at: SystemTime::now(),
        };
        let (evaluation, counted) =
            self.counts
                .evaluate(&policies, &call)
                .map_err(|full| Refusal::Uncountable {
                    why: full.to_string(),
                })?;
        let allow_rule = matches!(evaluation.decision, Decision::Allow { rule: Some(_) });
        let ask = match evaluation.decision {
            Decision::Block { rule: by, reason } => {
                *rule = by.map(str::to_owned);
                // A rule with a limit says when its next call is allowed,
                // as the rate limiter's refusal does.
                let wait = by
                    .and_then(|name| policies.rules().iter().find(|r| r.name() == name))
                    .and_then(|limited| {
                        let agent = ctx.agent_id.unwrap_or("");
                        self.counts.next_allowed(limited, agent, call.at)
                    });
                let reason = reason.to_owned();
                return Err(match wait {
                    Some(wait) => Refusal::RuleLimited { reason, wait },
                    None => Refusal::Blocked { reason },
                });
            }
            Decision::RequireApproval { rule: by, reason } => {
                *rule = Some(by.to_owned());
                Some(reason.to_owned())
            }
            Decision::Allow { .. } if cap.confirm() => Some(
                AskReason::Confirm {
                    capability,
                    device_name: device.manifest().name(),
                }
                .to_string(),
            ),
            Decision::Allow { .. } => None,
        };
        Ok(Ruled {
            counted,
            ask,
            allow_rule,
        })
    }

    /// Between checks 4 and 5: the agent's rate and the call's run, charged
    /// after the checks that need nobody (a call refused by them costs
    /// nothing) and before the person is asked (nobody is asked about a
    /// call over either).
    #[inline]
    pub(super) async fn charge(
        &self,
        ctx: &CallContext<'_>,
        device_id: &str,
    ) -> Result<(), Refusal> {
        let shared = self.registry.is_shared();
        if shared {
            self.charge_fleet_rate(ctx, device_id).await?;
        }
        self.meter
            .charge(ctx.agent_id, device_id, ctx.run, !shared)
            .map_err(Refusal::from)
    }

    /// The agent's rate, charged to buckets in a store shared by a fleet's
    /// vessels rather than in memory: an agent spreading its calls over
    /// several members has one rate. Their time is the wall clock, which
    /// the members share. A store that fails, or does not answer within
    /// [`DeviceToolAdapter::store_patience`], refuses the call.
    pub(super) async fn charge_fleet_rate(
        &self,
        ctx: &CallContext<'_>,
        device_id: &str,
    ) -> Result<(), Refusal> {
        let (Some(limits), Some(agent)) = (self.meter.rate_limits(), ctx.agent_id) else {
            return Ok(());
        };
        let mut takes = Vec::with_capacity(2);
        let mut which = Vec::with_capacity(2);
        for (limit, device) in [(limits.overall, None), (limits.per_device, Some(device_id))] {
            let Some(limit) = limit else { continue };
            let key = match device {
                None => agent.to_owned(),
                Some(device) => format!("{agent}\n{device}"),
            };
            takes.push(crate::store::BucketTake {
                key,
                calls_per_minute: limit.calls_per_minute.get(),
                burst: limit.burst.get(),
            });
            which.push((limit, device));
        }
        let now = dk_store::epoch_ms(SystemTime::now());
        let within = self.store_patience();
        let taking = self.registry.store().take_from_buckets_async(&takes, now);
        let refused = counts::within(within, taking)
            .await
            .unwrap_or_else(|| Err(counts::unanswered(within)))
            .map_err(|error| Refusal::CountsNotKept {
                why: error.to_string(),
            })?;
        let Some((index, wait_ms)) = refused else {
            return Ok(());
        };
        let Some((limit, device)) = which.get(index) else {
            return Ok(());
        };
        let (calls_per_minute, burst) = (limit.calls_per_minute.get(), limit.burst.get());
        Err(match device {
            None => Refusal::AgentRate {
                calls_per_minute,
                burst,
                wait_ms,
            },
            Some(device) => Refusal::DeviceRate {
                device_id: (*device).to_owned(),
                calls_per_minute,
                burst,
                wait_ms,
            },
        })
    }

    /// Check 5, when a rule or the capability's `confirm` asks (`ask` is
    /// why): an allowance, or the person's yes. Returns `None` when nobody
    /// was asked, else the gate's word on the calling agent before the wait
    /// (read before it, so that its removal meanwhile is noticed at check 6).
    pub(super) async fn ask_if_asked(
        &self,
        ctx: &CallContext<'_>,
        target: &Target<'_>,
        input: &Map<String, Value>,
        asked: Asked,
        person: &mut PersonSaid,
    ) -> Result<Option<Option<bool>>, Refusal> {
        let Some(reason) = asked.reason else {
            return Ok(None);
        };
        // Taken before the gate and the grant are read again: a change from
        // then on refuses to remember the person's answer.
        let stamp = self.registry.allowances().stamp();
        let gate_before = match (ctx.agent_gate, ctx.agent_id) {
            (Some(gate), Some(agent)) => {
                gate.may_call(agent, target.device_id, target.capability, target.read_only)
            }
            _ => None,
        };
        let asking = Asking {
            tool: target.tool,
            device_id: target.device_id,
            capability: target.capability,
            device: target.device,
            read_only: target.read_only,
            input,
            reason: Cow::Owned(reason),
            stamp,
            gate_before,
            allow_rule: asked.allow_rule,
        };
        self.ask_person(ctx, asking, person).await?;
        Ok(Some(gate_before))
    }

    /// Check 6, after the person was asked: still the same pairing, still
    /// granted, and the calling agent still exists and may still call it.
    /// Without a wait there is nothing to re-read: the reads of checks 1
    /// and 2 are the call's.
    #[inline]
    pub(super) fn check_unchanged(
        &self,
        ctx: &CallContext<'_>,
        target: &Target<'_>,
        gate_before: Option<bool>,
    ) -> Result<(), Refusal> {
        let Target {
            tool,
            device_id,
            capability,
            device,
            read_only,
        } = *target;
        match self.registry.get_with_grant(device_id, capability) {
            Some((now, granted)) if now.generation() == device.generation() => {
                if !granted {
                    return Err(Refusal::RevokedMeanwhile {
                        device_id: device_id.to_owned(),
                        capability: capability.to_owned(),
                    });
                }
            }
            _ => {
                return Err(Refusal::PairingChanged {
                    device_id: device_id.to_owned(),
                });
            }
        }
        match self.agent_gone(ctx, gate_before, tool, device_id, capability, read_only) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// Check 7: the device is connected; the counts of the rules the call
    /// matched are kept (the call is made), then the device is called and
    /// its answer, or failure, is the outcome.
    pub(super) async fn call_device(
        &self,
        ctx: &CallContext<'_>,
        device_id: &str,
        capability: &str,
        input: &Map<String, Value>,
        counted: counts::Counted<'_>,
        reached: &AtomicBool,
    ) -> Result<Checked, Refusal> {
        let link = self
            .links
            .reach(device_id)
            .ok_or_else(|| Refusal::NotConnected {
                device_id: device_id.to_owned(),
            })?;
        // A count is not taken for a call that will not be made.
        if !counted.is_empty() && !self.durable().await {
            return Err(Refusal::AuditFailing);
        }
        // The call is made: it counts against the limited rules it matched.
        counted
            .keep(self.registry.store().as_ref(), self.store_patience())
            .await
            .map_err(|not_kept| match not_kept {
                counts::NotKept::Store(error) => Refusal::CountsNotKept {
                    why: error.to_string(),
                },
                counts::NotKept::Reached(reason, wait) => Refusal::RuleLimited { reason, wait },
            })?;
        // After every wait (the person, the store), just before the device:
        // its record can still be made durable.
        if !self.durable().await {
            return Err(Refusal::AuditFailing);
        }
        let timeout = ctx.timeout.unwrap_or(self.call_timeout);
        reached.store(true, Ordering::Relaxed);
        Ok(match link.invoke(capability, input, timeout).await {
            Ok(result) => Checked::Answered(result),
            Err(error) => Checked::DeviceFailed(error),
        })
    }
}

/// Check 1: the capability the tool names, declared by the device.
#[inline]
pub(super) fn declared<'d>(
    device: &'d PairedDevice,
    device_id: &str,
    capability: &str,
) -> Result<&'d Capability, Refusal> {
    device
        .manifest()
        .capability(capability)
        .ok_or_else(|| Refusal::NoCapability {
            device_id: device_id.to_owned(),
            capability: capability.to_owned(),
        })
}

/// Check 2: the person granted the capability (no rule lifts this).
#[inline]
pub(super) fn check_granted(
    granted: bool,
    device_id: &str,
    capability: &str,
) -> Result<(), Refusal> {
    if granted {
        return Ok(());
    }
    Err(Refusal::NotGranted {
        device_id: device_id.to_owned(),
        capability: capability.to_owned(),
    })
}

/// Check 4: the input matches the capability's params (or its declared
/// input schema), and is an object.
#[inline]
pub(super) fn check_well_formed<'v>(
    cap: &Capability,
    input: &'v Value,
) -> Result<&'v Map<String, Value>, Refusal> {
    check_input(cap, input)?;
    if let Some(schema) = cap.declared_input_schema() {
        crate::input_schema::check(schema, input)?;
    }
    match input {
        Value::Object(input) => Ok(input),
        _ => Err(Refusal::Input(dk_proto::InputError::NotAnObject)),
    }
}

/// What check 3 found: the calls counted by rules with a limit, the
/// reason a rule asks the person, if one does, and whether an `allow` rule
/// named the call.
pub(super) struct Ruled<'c> {
    pub(super) counted: counts::Counted<'c>,
    pub(super) ask: Option<String>,
    pub(super) allow_rule: bool,
}

/// Why check 5 asks the person, if it does, and whether an `allow` rule
/// named the call (the person's explicit word that a yes to open a
/// microphone may be remembered).
pub(super) struct Asked {
    pub(super) reason: Option<String>,
    pub(super) allow_rule: bool,
}

/// The call's device and capability, as checks 5 and 6 see them.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) tool: &'a str,
    pub(super) device_id: &'a str,
    pub(super) capability: &'a str,
    pub(super) device: &'a PairedDevice,
    pub(super) read_only: bool,
}

/// What the person said about a call (check 5), for the record.
#[derive(Debug, Default)]
pub(super) struct PersonSaid {
    /// Their answer, when asked.
    pub(super) answer: Option<bool>,
    /// The allowance made by their answer, or that answered for them.
    pub(super) allowance: Option<AllowanceUse>,
    /// Who answered, when the approver says.
    pub(super) by: Option<By>,
}

/// A call that needs the person's yes, as check 5 sees it.
pub(super) struct Asking<'a> {
    pub(super) tool: &'a str,
    pub(super) device_id: &'a str,
    pub(super) capability: &'a str,
    pub(super) device: &'a PairedDevice,
    pub(super) read_only: bool,
    pub(super) input: &'a Map<String, Value>,
    pub(super) reason: Cow<'a, str>,
    /// The allowances' count of changes before the gate was read.
    pub(super) stamp: u64,
    /// The gate's word on the agent before the wait.
    pub(super) gate_before: Option<bool>,
    /// Whether an `allow` rule named the call.
    pub(super) allow_rule: bool,
}

/// How the checks ended.
pub(super) enum Checked {
    /// Every check passed and the device answered.
    Answered(Option<Box<RawValue>>),
    /// A check refused the call.
    Refused(Refusal),
    /// Every check passed but the call failed: the device's error or the
    /// vessel's failure to reach it (recorded as allowed, reads
    /// `device error: ...`).
    DeviceFailed(InvokeError),
}
