//! A device's end of a dk/2 channel for the benches, built from dk-channel's
//! pieces: the handshake, sealed frames both ways, and the pairing exchange
//! (commitment, nonce, reveal, the code). Included with `#[path]` by the
//! benches that compare dk/2 with v1.

#![allow(
    dead_code,
    reason = "every bench compiles this module as its own and uses only part of it"
)]

use dk_channel::{FrameKind, Initiator, OpenedFrame, Opener, RecordLimits, Sealer, StaticKey};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async_with_config};

use super::common::BoxError;

/// The WebSocket under the channel.
pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A handshaken dk/2 connection.
pub struct Dk2 {
    pub socket: Socket,
    pub sealer: Sealer,
    pub opener: Opener,
    pub handshake_hash: [u8; 32],
}

/// Opens `url` asking for `dk.2` and runs the handshake as a fresh key.
pub async fn connect(url: &str) -> Result<Dk2, BoxError> {
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("sec-websocket-protocol", HeaderValue::from_static("dk.2"));
    // Without TCP_NODELAY the handshake's last message and the first record
    // behind it wait on the vessel's delayed acknowledgement (40 ms).
    let (mut socket, response) = connect_async_with_config(request, None, true).await?;
    if response
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        != Some("dk.2")
    {
        return Err("the vessel did not answer with dk.2".into());
    }
    let key = StaticKey::generate()?;
    let mut initiator = Initiator::new(&key)?;
    socket
        .send(Message::binary(initiator.first_message()?))
        .await?;
    let second = next_binary(&mut socket).await?;
    initiator.read_second(&second)?;
    let (third, established) = initiator.third_message()?;
    socket.send(Message::binary(third)).await?;
    let handshake_hash = established.handshake_hash;
    let (sealer, opener) = established.split(RecordLimits {
        max_text: 1 << 20,
        max_binary: 1 << 20,
    });
    Ok(Dk2 {
        socket,
        sealer,
        opener,
        handshake_hash,
    })
}

async fn next_binary(socket: &mut Socket) -> Result<Vec<u8>, BoxError> {
    loop {
        match socket.next().await {
            Some(Ok(Message::Binary(bytes))) => return Ok(bytes.to_vec()),
            Some(Ok(Message::Close(frame))) => {
                return Err(format!("the vessel closed the handshake: {frame:?}").into());
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => return Err("the vessel hung up during the handshake".into()),
        }
    }
}

impl Dk2 {
    /// Seals `text` as one frame and sends its records.
    pub async fn send_text(&mut self, text: &str) -> Result<(), BoxError> {
        for record in self.sealer.seal(FrameKind::Text, text.as_bytes())? {
            self.socket.send(Message::binary(record)).await?;
        }
        Ok(())
    }

    /// The next whole text frame; `None` once the vessel closed the
    /// connection.
    pub async fn next_text(&mut self) -> Result<Option<String>, BoxError> {
        loop {
            match self.socket.next().await {
                Some(Ok(Message::Binary(bytes))) => {
                    if let Some(OpenedFrame::Text(text)) = self.opener.open(&bytes)? {
                        return Ok(Some(text));
                    }
                }
                Some(Ok(Message::Close(_))) | None => return Ok(None),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
            }
        }
    }

    /// The next frame as JSON; an error once the vessel closed.
    pub async fn next_frame(&mut self) -> Result<Value, BoxError> {
        let text = self
            .next_text()
            .await?
            .ok_or("the vessel closed the connection")?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Sends `device:hello` with `manifest` and plays the device's half of
    /// the pairing exchange; returns the code the device would show.
    pub async fn hello(&mut self, manifest: &Value) -> Result<String, BoxError> {
        self.send_text(&json!({"type": "device:hello", "manifest": manifest}).to_string())
            .await?;
        let commit = self.next_frame().await?;
        let commitment = commit
            .get("commitment")
            .and_then(Value::as_str)
            .and_then(dk_channel::from_hex32)
            .ok_or_else(|| format!("expected device:pair-commit, got {commit}"))?;
        let nd = dk_channel::random_nonce()?;
        let nonce = json!({"type": "device:pair-nonce", "nonce": dk_channel::to_hex32(&nd)});
        self.send_text(&nonce.to_string()).await?;
        let reveal = self.next_frame().await?;
        let nv = reveal
            .get("nonce")
            .and_then(Value::as_str)
            .and_then(dk_channel::from_hex32)
            .ok_or_else(|| format!("expected device:pair-reveal, got {reveal}"))?;
        if !dk_channel::commitment_holds(&commitment, &nv, &self.handshake_hash) {
            return Err("the vessel's reveal does not match its commitment".into());
        }
        Ok(dk_channel::pairing_code(&self.handshake_hash, &nd, &nv))
    }

    /// Reads frames until one of type `kind`.
    pub async fn read_until(&mut self, kind: &str) -> Result<Value, BoxError> {
        loop {
            let frame = self.next_frame().await?;
            if frame.get("type").and_then(Value::as_str) == Some(kind) {
                return Ok(frame);
            }
        }
    }
}
