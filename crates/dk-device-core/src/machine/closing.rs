//! How a connection ends: the device's close (and the wait for the
//! vessel's), a broken channel or pairing, and what a close from the vessel
//! means (on dk/2, only a close announced inside the channel counts).

use alloc::string::{String, ToString as _};

use dk_proto::{Channel, CloseCode, CloseFrame, CloseWhy};

use super::phase::Phase;
use super::{Break, DeviceCore, End, Message, Notice, Output, Retry, Stop, unexpected_condition};
use crate::time::Instant;

impl DeviceCore {
    /// Gives the end out once, and forgets the connection.
    pub(super) fn end(&mut self, end: End) {
        self.calls.abandon();
        self.phase = Phase::Ended;
        self.outputs.push_back(Output::Ended(end));
    }

    /// Sends a close and waits for the vessel's (or the timer) to end with
    /// `then`.
    pub(super) fn close(&mut self, now: Instant, frame: CloseFrame, then: End) {
        self.calls.abandon();
        self.send(Message::Close(Some(frame)));
        let link = self.phase.take_link();
        self.phase = Phase::Closing {
            deadline: now.saturating_add(self.config.close_timeout),
            then,
            link,
        };
    }

    pub(super) fn finish_closing(&mut self) {
        if let Phase::Closing { then, .. } = core::mem::replace(&mut self.phase, Phase::Ended) {
            self.end(then);
        }
    }

    pub(super) fn broken(&mut self, now: Instant, why: Break) {
        match why {
            // One code whatever failed, as the vessel does.
            Break::Channel => self.close(
                now,
                CloseFrame::new(CloseCode::SecureChannel, "secure channel failed"),
                End::Retry(Retry::Lost),
            ),
            Break::Pairing(why) => {
                let reason = CloseWhy::PairingDidNotHappen(why.clone()).to_string();
                self.close(
                    now,
                    CloseFrame::new(CloseCode::PairingRefused, reason),
                    End::Stop(Stop::PairingBroken(why)),
                );
            }
            Break::Token => self.close(
                now,
                unexpected_condition("cannot keep the device token"),
                End::Stop(Stop::BadToken),
            ),
        }
    }
    /// What a close from the vessel means: connect again when the close
    /// says so, else stop with what it stands for (forgetting the
    /// credential when the vessel did).
    pub(super) fn closed_with(&mut self, code: u16, reason: String) -> End {
        // Over dk/2 a close travels outside the channel, where anyone on the
        // path can forge one: only a close announced inside it counts.
        let (code, reason) = match self.phase.secure_mut().map(|secure| secure.closing.take()) {
            None => (code, reason),
            Some(Some(announced)) => announced,
            Some(None) => {
                self.notice(Notice::UnannouncedClose(code));
                return End::Retry(Retry::Closed { code, reason });
            }
        };
        let frame = CloseFrame { code, reason };
        if frame.retry() {
            return End::Retry(Retry::Closed {
                code,
                reason: frame.reason,
            });
        }
        match frame.close_code() {
            Some(CloseCode::PairingRefused) => End::Stop(Stop::PairingRefused(frame.reason)),
            Some(CloseCode::AuthFailed) => {
                self.forget_credential();
                End::Stop(Stop::AuthFailed)
            }
            Some(CloseCode::ManifestChanged) => {
                // dk/2: the next run asks to pair again (with its pin kept),
                // as the close says, instead of sending device:auth forever.
                if self.config.channel == Channel::Dk2 {
                    self.forget_credential();
                }
                End::Stop(Stop::ManifestChanged)
            }
            Some(CloseCode::Unpaired) => {
                self.forget_credential();
                End::Stop(Stop::Unpaired)
            }
            // Not the session cap, which frees up when another session ends.
            Some(CloseCode::AdmissionRefused) => End::Stop(Stop::AdmissionRefused(frame.reason)),
            _ => End::Retry(Retry::Closed {
                code,
                reason: frame.reason,
            }),
        }
    }

    /// Forgets the credential the connection used: a dk/2 key is marked
    /// unpaired (the key and the vessel's pin stay), a v1 token dropped.
    fn forget_credential(&mut self) {
        match self.config.channel {
            Channel::Dk2 => {
                if let Some(credentials) = self.credentials.as_mut() {
                    credentials.unpair();
                    self.outputs.push_back(Output::Store(credentials.clone()));
                }
            }
            Channel::V1 => {
                if let Some(token) = self.token.take() {
                    self.outputs.push_back(Output::ForgetToken(token));
                }
            }
        }
    }
}
