//! A connection's first frames, up to its session: the device's hello,
//! then its auth or its pairing (the person asked, with the code shown or,
//! on dk/2, computed from the handshake hash after a commit, nonce and
//! reveal exchange).

use std::borrow::Cow;
use std::sync::Arc;

use dk_proto::{
    Channel, CloseCode, CloseFrame, CloseWhy, DeviceFrame, FrameError, PairingLimit, VesselFrame,
};
use futures::{Stream, StreamExt};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::reader::{Ending, Reader, Secured, Session, WireMessage, close, going_away, not_paired};
use crate::registry::{AuthError, AuthenticatedDevice, PairError};
use crate::stream::streaming_class;

impl<S> Reader<'_, S>
where
    S: Stream<Item = WireMessage> + Unpin,
{
    /// Waits for the first frame and pairs or authenticates.
    pub(super) async fn handshake(&mut self) -> Result<Session, Ending> {
        let text = self.first_text().await?;
        match self.first_frame(&text)? {
            DeviceFrame::Hello { manifest } => self.hello(&manifest).await,
            DeviceFrame::KeyAuth {
                device_id,
                manifest,
            } => self.key_auth(&device_id, &manifest).await,
            DeviceFrame::PairNonce { .. } => Err(Ending::Close(not_paired(
                "device:pair-nonce before device:hello",
            ))),
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => {
                self.token_auth(&device_id, &token, manifest.as_deref())
                    .await
            }
            _ => Err(Ending::Close(CloseFrame::canonical(
                CloseCode::BadHandshake,
            ))),
        }
    }

    /// The first text frame, read within the handshake deadline (pings
    /// charged, pongs ignored on the way).
    async fn first_text(&mut self) -> Result<String, Ending> {
        // Counted from the connect, so the upgrade is inside the deadline.
        let deadline = self.permit.connected_at() + self.vessel.limits().handshake_timeout;
        loop {
            let message = tokio::select! {
                message = tokio::time::timeout_at(deadline, self.incoming.next()) => message,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
            };
            match message {
                Err(_) => {
                    return Err(Ending::Close(CloseFrame::canonical(
                        CloseCode::HandshakeTimeout,
                    )));
                }
                Ok(None | Some(WireMessage::Close(_))) => return Err(Ending::Left),
                Ok(Some(WireMessage::Pong(_))) => {}
                Ok(Some(WireMessage::Ping(_))) => self.charge().map_err(Ending::Close)?,
                Ok(Some(WireMessage::Binary(_))) => {
                    return Err(Ending::Close(close(
                        CloseCode::BadHandshake,
                        "frames are JSON text",
                    )));
                }
                Ok(Some(WireMessage::Text(text))) => return Ok(text),
            }
        }
    }

    /// The first frame parsed: one too large or malformed closes the
    /// connection, the latter after an error frame saying why.
    fn first_frame<'t>(&mut self, text: &'t str) -> Result<DeviceFrame<'t>, Ending> {
        match DeviceFrame::parse_on(text.as_bytes(), self.frame_limits(), self.channel()) {
            Ok(frame) => Ok(frame),
            Err(FrameError::TooLarge { max, .. }) => Err(Ending::Close(close(
                CloseCode::TooLarge,
                CloseWhy::FrameTooLarge(max).to_string(),
            ))),
            Err(e) => {
                self.out.error(&e.to_string());
                Err(Ending::Close(close(
                    CloseCode::BadHandshake,
                    "expected device:hello or device:auth",
                )))
            }
        }
    }

    /// `device:hello`: the pairing attempt counted against its address, a
    /// valid manifest given a place among those waiting for the person
    /// (unless the listener or the streaming budget refuses it first), then
    /// the pairing itself, on dk/1 or inside dk/2's channel.
    async fn hello(&mut self, manifest: &RawValue) -> Result<Session, Ending> {
        let manifest: Value = serde_json::from_str(manifest.get()).unwrap_or(Value::Null);
        let address = self.permit.address();
        let limit = |limit: PairingLimit| Ending::Close(limit.into());
        self.vessel.note_pairing_attempt(address).map_err(limit)?;
        // An invalid manifest never reaches the person, so it takes no place.
        let _waiting = match dk_proto::validate_manifest(&manifest) {
            Ok(valid) => {
                // Off loopback a relay could claim to have no
                // screen and so skip the comparison.
                if valid.no_screen()
                    && self.permit.is_off_loopback()
                    && !self.vessel.limits().no_screen_off_loopback
                {
                    return Err(Ending::Close(close(
                        CloseCode::PairingRefused,
                        "no-screen pairing is off on this listener",
                    )));
                }
                // A streaming kind the vessel would refuse never
                // reaches the person.
                if let Some(class) = streaming_class(valid.kind()) {
                    let budget = self.vessel.session_budget();
                    if let Err(error) =
                        self.vessel
                            .streams()
                            .precheck(valid.id(), class, budget.as_ref())
                    {
                        return Err(Ending::Close(self.refuse(
                            valid.id(),
                            class,
                            "pair",
                            &error,
                        )));
                    }
                }
                Some(
                    self.vessel
                        .begin_pairing(valid.id(), address)
                        .map_err(limit)?,
                )
            }
            Err(_) => None,
        };
        match self.secured {
            Some(secured) => self.pair_secured(&manifest, secured).await,
            None => self.pair(&manifest).await,
        }
    }

    /// dk/2's `device:auth` with no token: the device let in by the key
    /// its channel proved, pinned when it paired.
    async fn key_auth(&mut self, device_id: &str, manifest: &RawValue) -> Result<Session, Ending> {
        let Some(secured) = self.secured else {
            return Err(Ending::Close(CloseFrame::canonical(CloseCode::AuthFailed)));
        };
        let manifest: Value = serde_json::from_str(manifest.get()).unwrap_or(Value::Null);
        self.vessel.registry().recall(device_id).await;
        authenticated(self.vessel.registry().authenticate_key(
            device_id,
            &secured.remote,
            &manifest,
        ))
    }

    /// `device:auth` with a token, and the manifest dk's device client
    /// sends along.
    async fn token_auth(
        &mut self,
        device_id: &str,
        token: &str,
        manifest: Option<&RawValue>,
    ) -> Result<Session, Ending> {
        let manifest: Option<Value> =
            manifest.map(|m| serde_json::from_str(m.get()).unwrap_or(Value::Null));
        self.vessel.registry().recall(device_id).await;
        authenticated(
            self.vessel
                .registry()
                .authenticate(device_id, token, manifest.as_ref()),
        )
    }

    /// Pairs: the code goes to the device, the question to the person. The
    /// device leaving withdraws the question.
    pub(super) async fn pair(&mut self, manifest: &Value) -> Result<Session, Ending> {
        let person = Arc::clone(self.vessel.person());
        let consent_timeout = self.vessel.limits().consent_timeout;
        let frames = self.out.frames.clone();
        let pairing = self.vessel.registry().pair(
            manifest,
            |code| {
                let frame = VesselFrame::Pairing {
                    code: Cow::Borrowed(code),
                };
                let _ = frames.send(frame.to_json());
            },
            |request| async move {
                Ok::<_, std::convert::Infallible>(
                    person.ask_consent(request, consent_timeout).await,
                )
            },
            consent_timeout,
        );
        tokio::pin!(pairing);
        let result = loop {
            tokio::select! {
                result = &mut pairing => break result,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
                // Anything else while the person decides is set aside.
                message = self.incoming.next() => self.set_aside(message)?,
            }
        };
        match result {
            Ok(paired) => {
                self.out.frame(&VesselFrame::Paired {
                    device_token: Cow::Borrowed(paired.token.expose()),
                });
                Ok(Session {
                    device_id: paired.device_id,
                    generation: paired.generation,
                    paired_now: true,
                    stream: None,
                })
            }
            Err(e) => Err(Ending::Close(close(
                CloseCode::PairingRefused,
                e.to_string(),
            ))),
        }
    }

    /// Pairs over dk/2: the vessel commits to its nonce, takes the device's,
    /// reveals its own, and only then asks the person, showing the code
    /// both sides compute from the channel; nothing sends the code. A yes
    /// pins the channel's key to the device id. Each side's pairing frame
    /// comes once and in order: anything else ends the pairing (4001).
    pub(super) async fn pair_secured(
        &mut self,
        manifest: &Value,
        secured: Secured,
    ) -> Result<Session, Ending> {
        let valid = match dk_proto::validate_manifest(manifest) {
            Ok(valid) => valid,
            Err(e) => {
                return Err(Ending::Close(close(
                    CloseCode::PairingRefused,
                    PairError::InvalidManifest(e).to_string(),
                )));
            }
        };
        let Ok(nv) = dk_channel::random_nonce() else {
            return Err(Ending::Close(CloseFrame::canonical(
                CloseCode::SecureChannel,
            )));
        };
        let commitment = dk_channel::commitment(&nv, &secured.handshake_hash);
        self.out.frame(&VesselFrame::PairCommit {
            commitment: Cow::Owned(dk_channel::to_hex32(&commitment)),
        });
        let nd = self.pairing_nonce().await?;
        self.out.frame(&VesselFrame::PairReveal {
            nonce: Cow::Owned(dk_channel::to_hex32(&nv)),
        });
        let code = dk_channel::pairing_code(&secured.handshake_hash, &nd, &nv);
        let person = Arc::clone(self.vessel.person());
        let consent_timeout = self.vessel.limits().consent_timeout;
        let pairing = self.vessel.registry().pair_with_key(
            valid,
            code,
            secured.remote,
            |request| async move {
                Ok::<_, std::convert::Infallible>(
                    person.ask_consent(request, consent_timeout).await,
                )
            },
            consent_timeout,
        );
        tokio::pin!(pairing);
        let result = loop {
            tokio::select! {
                result = &mut pairing => break result,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
                // Anything else while the person decides is set aside, but
                // a second nonce ends the pairing.
                message = self.incoming.next() => {
                    if let Some(WireMessage::Text(text)) = &message
                        && let Ok(DeviceFrame::PairNonce { .. }) = DeviceFrame::parse_on(
                            text.as_bytes(),
                            self.frame_limits(),
                            Channel::Dk2,
                        )
                    {
                        return Err(Ending::Close(not_paired("a second device:pair-nonce")));
                    }
                    self.set_aside(message)?;
                }
            }
        };
        match result {
            Ok(paired) => {
                self.out.frame(&VesselFrame::KeyPaired);
                Ok(Session {
                    device_id: paired.device_id,
                    generation: paired.generation,
                    paired_now: true,
                    stream: None,
                })
            }
            Err(e) => Err(Ending::Close(close(
                CloseCode::PairingRefused,
                e.to_string(),
            ))),
        }
    }

    /// Waits for the device's `device:pair-nonce`, the one frame it may
    /// send after the commitment, within the handshake deadline.
    pub(super) async fn pairing_nonce(&mut self) -> Result<[u8; 32], Ending> {
        let deadline = Instant::now() + self.vessel.limits().handshake_timeout;
        loop {
            let message = tokio::select! {
                message = tokio::time::timeout_at(deadline, self.incoming.next()) => message,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
            };
            let text = match message {
                Err(_) => return Err(Ending::Close(not_paired("no device:pair-nonce in time"))),
                Ok(None | Some(WireMessage::Close(_))) => return Err(Ending::Left),
                Ok(Some(WireMessage::Pong(_))) => continue,
                Ok(Some(WireMessage::Ping(_))) => {
                    self.charge().map_err(Ending::Close)?;
                    continue;
                }
                Ok(Some(WireMessage::Binary(_))) => {
                    return Err(Ending::Close(not_paired("expected device:pair-nonce")));
                }
                Ok(Some(WireMessage::Text(text))) => text,
            };
            return match DeviceFrame::parse_on(text.as_bytes(), self.frame_limits(), Channel::Dk2) {
                Ok(DeviceFrame::PairNonce { nonce }) => dk_channel::from_hex32(&nonce)
                    .ok_or_else(|| Ending::Close(not_paired("expected device:pair-nonce"))),
                _ => Err(Ending::Close(not_paired("expected device:pair-nonce"))),
            };
        }
    }
}

/// The session of a device the registry let in, or the close saying why
/// it did not.
fn authenticated(device: Result<AuthenticatedDevice, AuthError>) -> Result<Session, Ending> {
    match device {
        Ok(device) => Ok(Session {
            device_id: device.device_id().to_owned(),
            generation: device.generation(),
            paired_now: false,
            stream: None,
        }),
        Err(AuthError::ManifestChanged) => Err(Ending::Close(CloseFrame::canonical(
            CloseCode::ManifestChanged,
        ))),
        Err(_) => Err(Ending::Close(CloseFrame::canonical(CloseCode::AuthFailed))),
    }
}
