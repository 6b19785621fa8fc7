//! A call from the vessel, carried to Python and back: the device core has
//! already checked it (a capability of the manifest, a call id not seen
//! before, input within the declared bounds); here its input goes to the
//! Python dispatcher as JSON text, on the connection's thread (made a
//! blocking one for the while when the handler was declared blocking), and
//! the answer
//! comes back through a [`Reply`], from that thread or, for an `async def`
//! handler, from the asyncio loop that ran it.

use std::sync::{Arc, Mutex, PoisonError};

use dk_device::HandlerError;
use pyo3::prelude::*;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

/// The Python callable every call is handed to while the device runs,
/// `dispatch(capability, input_json, reply)`; none when it does not run.
pub(crate) type Dispatcher = Arc<Mutex<Option<Py<PyAny>>>>;

/// What a handler answered.
#[derive(Debug)]
enum Answer {
    /// A result, as JSON text.
    Result(String),
    /// An error, in words: the call's error text.
    Error(String),
}

/// Answers one call, once: a second answer is ignored.
#[pyclass(module = "dk_device._native", frozen)]
pub(crate) struct Reply {
    answer: Mutex<Option<oneshot::Sender<Answer>>>,
}

#[pymethods]
impl Reply {
    /// Answers the call with `result`, a JSON text.
    fn ok(&self, result: String) {
        self.send(Answer::Result(result));
    }

    /// Answers the call with an error; `text` is what the vessel is told.
    fn error(&self, text: String) {
        self.send(Answer::Error(text));
    }
}

impl Reply {
    fn send(&self, answer: Answer) {
        let sender = self
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(sender) = sender {
            // The call may be gone (the connection ended): nobody to tell.
            let _ = sender.send(answer);
        }
    }
}

/// Where a handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handling {
    /// On the connection's thread, which serves nothing else meanwhile: for
    /// handlers that return at once (and `async def` ones, which only hand
    /// their coroutine to the loop).
    Inline,
    /// On the connection's thread made a blocking one while the handler
    /// runs, the connection served by another: for handlers that sleep or
    /// wait on hardware.
    Blocking,
}

/// Runs `capability`'s Python handler with `input` and returns its answer.
pub(crate) async fn call(
    dispatcher: Dispatcher,
    capability: String,
    input: Map<String, Value>,
    how: Handling,
) -> Result<Value, HandlerError> {
    let (sender, answer) = oneshot::channel();
    let reply = Reply {
        answer: Mutex::new(Some(sender)),
    };
    let input = Value::Object(input).to_string();
    let hand = || {
        Python::attach(|py| {
            let dispatch = dispatcher
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .map(|d| d.clone_ref(py));
            let Some(dispatch) = dispatch else {
                return Err("the device is not running".to_owned());
            };
            dispatch
                .call1(py, (capability.as_str(), input, reply))
                .map(drop)
                .map_err(|e| e.to_string())
        })
    };
    // A quick handler is called on the connection's own thread: a call
    // crosses no thread on its way in or out. One that may block is called
    // on this thread too, but made a blocking one for the while: another
    // takes the connection over, which goes on serving.
    let handed = match how {
        Handling::Inline => hand(),
        Handling::Blocking => tokio::task::block_in_place(hand),
    };
    if let Err(why) = handed {
        return Err(HandlerError::new(format!(
            "the handler of \"{capability}\" could not be called: {why}"
        )));
    }
    match answer.await {
        Ok(Answer::Result(json)) => serde_json::from_str(&json)
            .map_err(|e| HandlerError::new(format!("result of \"{capability}\" is not JSON: {e}"))),
        Ok(Answer::Error(text)) => Err(HandlerError::new(text)),
        Err(_) => Err(HandlerError::new(format!(
            "the handler of \"{capability}\" gave no answer"
        ))),
    }
}
