//! The pairing, the device's side. v1: the vessel's code to show, then its
//! token to keep. dk/2: the vessel's commitment, the device's nonce, the
//! vessel's reveal checked against its commitment and the code computed
//! from both nonces and the handshake, then `device:paired` pinning the
//! vessel's key. Anything repeated, early or out of order breaks a dk/2
//! pairing.

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::ToString as _;

use dk_channel::FrameKind;
use dk_proto::{Channel, DeviceFrame, FrameLimits, VesselFrame};

use super::phase::{Link, PairStep, Phase};
use super::{Break, DeviceCore, Notice, Output, is_token, printable};
use crate::calls::SetAside;
use crate::entropy::random32;

impl DeviceCore {
    /// v1's pairing: the code to show, then the token.
    pub(super) fn pair_v1(&mut self, text: &str) -> Result<(), Break> {
        match VesselFrame::parse(text.as_bytes()) {
            Ok(VesselFrame::Pairing { code }) => self.show_code(&code),
            Ok(VesselFrame::Paired { device_token }) => {
                if !is_token(&device_token) {
                    return Err(Break::Token);
                }
                let token = device_token.into_owned();
                self.token = Some(token.clone());
                self.outputs.push_back(Output::StoreToken(token));
                self.phase = Phase::Serving {
                    link: Link::V1,
                    stream_cap: 0,
                    stop_by: None,
                };
            }
            Ok(VesselFrame::Error { error }) => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))));
            }
            Ok(other) => self.notice(Notice::Ignored(other.type_name())),
            Err(error) => self.notice(Notice::SetAside(SetAside::Refused(error))),
        }
        Ok(())
    }

    /// One frame of dk/2's pairing exchange, read once and taken in the
    /// step it comes in.
    pub(super) fn pair_dk2(&mut self, text: &str) -> Result<(), Break> {
        let frame =
            match VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2) {
                Ok(frame) => frame,
                Err(error) => {
                    // A pairing frame that does not parse (a nonce that is not
                    // 64 hex digits, v1's code on dk/2) ends the pairing.
                    if let Some(kind) = VesselFrame::pairing_type(text) {
                        return Err(Break::Pairing(format!(
                            "a malformed or unexpected {kind} frame"
                        )));
                    }
                    self.notice(Notice::SetAside(SetAside::Refused(error)));
                    return Ok(());
                }
            };
        let step = match core::mem::replace(&mut self.phase, Phase::Ended) {
            Phase::Pairing(step) => step,
            other => {
                self.phase = other;
                return Ok(());
            }
        };
        let (step, outcome) = self.pair_step(step, frame);
        if let Some(step) = step {
            self.phase = Phase::Pairing(step);
        }
        outcome
    }

    /// The next step of the pairing after `frame`, or `None` when the
    /// pairing ended (paired: the phase is set to serving).
    fn pair_step(
        &mut self,
        step: PairStep,
        frame: VesselFrame<'_>,
    ) -> (Option<PairStep>, Result<(), Break>) {
        let broken = |step, why: &str| (Some(step), Err(Break::Pairing(why.to_string())));
        match (step, frame) {
            (PairStep::AwaitCommit(mut secure), VesselFrame::PairCommit { commitment }) => {
                let Some(commitment) = dk_channel::from_hex32(&commitment) else {
                    return broken(
                        PairStep::AwaitCommit(secure),
                        "a commitment that is not 64 hex digits",
                    );
                };
                let Ok(nonce) = random32(self.entropy.as_mut()) else {
                    return broken(
                        PairStep::AwaitCommit(secure),
                        "the device has no random bytes for its nonce",
                    );
                };
                let frame = DeviceFrame::PairNonce {
                    nonce: Cow::Owned(dk_channel::to_hex32(&nonce)),
                }
                .to_json();
                let _ = secure.seal(FrameKind::Text, frame.as_bytes(), &mut self.outputs);
                let next = PairStep::AwaitReveal {
                    secure,
                    commitment,
                    nonce,
                };
                (Some(next), Ok(()))
            }
            (step, VesselFrame::PairCommit { .. }) => broken(step, "a second commitment"),
            (
                PairStep::AwaitReveal {
                    secure,
                    commitment,
                    nonce,
                },
                VesselFrame::PairReveal { nonce: revealed },
            ) => {
                let unchanged = |secure| PairStep::AwaitReveal {
                    secure,
                    commitment,
                    nonce,
                };
                let Some(revealed) = dk_channel::from_hex32(&revealed) else {
                    return broken(unchanged(secure), "a reveal that is not 64 hex digits");
                };
                if !dk_channel::commitment_holds(&commitment, &revealed, &secure.handshake_hash) {
                    return broken(
                        unchanged(secure),
                        "the vessel's reveal does not match its commitment (a relay may be in the middle)",
                    );
                }
                let code = dk_channel::pairing_code(&secure.handshake_hash, &nonce, &revealed);
                self.show_code(&code);
                (Some(PairStep::AwaitPaired(secure)), Ok(()))
            }
            (step @ (PairStep::V1 | PairStep::AwaitCommit(_)), VesselFrame::PairReveal { .. }) => {
                broken(step, "a reveal before the commitment")
            }
            (step @ PairStep::AwaitPaired(_), VesselFrame::PairReveal { .. }) => {
                broken(step, "a second reveal")
            }
            (PairStep::AwaitPaired(secure), VesselFrame::KeyPaired) => {
                let vessel = secure.vessel;
                if let Some(credentials) = self.credentials.as_mut() {
                    credentials.pin(vessel);
                    self.outputs.push_back(Output::Store(credentials.clone()));
                }
                self.outputs.push_back(Output::Pinned(vessel));
                self.phase = Phase::Serving {
                    link: Link::Dk2(secure),
                    stream_cap: 0,
                    stop_by: None,
                };
                (None, Ok(()))
            }
            (step, VesselFrame::KeyPaired) => broken(step, "paired before the codes were computed"),
            (mut step, VesselFrame::Closing { code, reason }) => {
                if let Some(secure) = step.secure_mut() {
                    secure.closing = Some((code, printable(&reason)));
                }
                (Some(step), Ok(()))
            }
            (step, VesselFrame::Error { error }) => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))));
                (Some(step), Ok(()))
            }
            (step, other) => {
                self.notice(Notice::Ignored(other.type_name()));
                (Some(step), Ok(()))
            }
        }
    }
}
