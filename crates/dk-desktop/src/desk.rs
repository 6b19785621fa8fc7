//! The thread that owns the X connection: every X action of the device runs
//! here, one at a time, away from the async runtime. When the display goes
//! away the thread says so in the log, refuses calls with the display's
//! name, and connects again every second until it is back.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::config::{Blackout, Size};
use crate::image::{self, Rgb};
use crate::x11::{GRAB_LIMIT, Session, XError};

/// How often the thread checks the connection, and tries again when the
/// display is gone.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// An action the thread runs with the display, answering on its own
/// channel.
type Job = Box<dyn FnOnce(&mut Desk) + Send>;

/// The state the thread keeps: the display's name, the connection when
/// there is one, and what to black out.
pub struct Desk {
    display: String,
    session: Option<Session>,
    /// True once the connection was lost, until it is made again.
    lost: bool,
    blackout: Blackout,
    size: Size,
    root_clicks: bool,
}

/// Why an action failed, as the agent is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl Desk {
    /// The size screenshots fit.
    pub fn size(&self) -> Size {
        self.size
    }

    /// What is blacked out.
    pub fn blackout(&self) -> &Blackout {
        &self.blackout
    }

    /// Whether clicks may land on the bare desktop.
    pub fn root_clicks(&self) -> bool {
        self.root_clicks
    }

    fn unreachable(&self) -> Refusal {
        Refusal(format!(
            "the X display {} is not reachable; the device reconnects when it returns",
            self.display
        ))
    }

    fn connect(&mut self) -> bool {
        match Session::connect(&self.display) {
            Ok(session) => {
                let (w, h) = session.size().unwrap_or_default();
                self.session = Some(session);
                if std::mem::take(&mut self.lost) {
                    tracing::warn!(display = %self.display, "the X display is back ({w}x{h})");
                } else {
                    tracing::info!(display = %self.display, "connected to the X display ({w}x{h})");
                }
                true
            }
            Err(XError::Gone(why) | XError::Failed(why)) => {
                tracing::debug!(display = %self.display, "the X display is not reachable: {why}");
                false
            }
        }
    }

    /// Runs `act` on the connection (made now if there is none). A lost
    /// connection is dropped and logged, and the call refused with the
    /// display's name.
    pub fn with<T>(
        &mut self,
        act: impl FnOnce(&Session, &Desk) -> Result<T, XError>,
    ) -> Result<T, Refusal> {
        if self.session.is_none() && !self.connect() {
            return Err(self.unreachable());
        }
        let session = self.session.take();
        let result = match &session {
            Some(s) => act(s, self),
            None => return Err(self.unreachable()),
        };
        match result {
            Ok(value) => {
                self.session = session;
                Ok(value)
            }
            Err(XError::Gone(why)) => {
                self.lost(&why);
                Err(self.unreachable())
            }
            Err(XError::Failed(why)) => {
                self.session = session;
                Err(Refusal(why))
            }
        }
    }

    fn lost(&mut self, why: &str) {
        self.session = None;
        self.lost = true;
        tracing::warn!(
            display = %self.display,
            "the X display went away ({why}); connecting again every second"
        );
    }

    /// Checks the connection is alive (reading what the server sent); tries
    /// again when there is none.
    fn tend(&mut self) {
        match &self.session {
            Some(session) => {
                if let Err(XError::Gone(why)) = session
                    .drain()
                    .and_then(|()| session.give_back_spares(false))
                {
                    self.lost(&why);
                }
            }
            None => {
                self.connect();
            }
        }
    }
}

/// The screen's pixels in the screen rectangle (`x`, `y`, `width`,
/// `height`), blacked out where `blackout` says, scaled to fit `size`, and
/// whether any of it was blacked out. The window tree and the pixels are
/// read with the server grabbed, so both are of one instant: no window
/// moves, opens or closes in between. The grab lasts at most
/// [`GRAB_LIMIT`]; with no window listed there is no tree to read, and no
/// grab.
pub fn shoot(
    session: &Session,
    blackout: &Blackout,
    area: (u32, u32, u32, u32),
    size: Size,
) -> Result<(Rgb, bool), XError> {
    let (x, y, width, height) = area;
    let until = Instant::now() + GRAB_LIMIT;
    let read = || {
        Ok((
            session.blacked(blackout, until)?,
            session.capture(area, until)?,
        ))
    };
    let (blacked, mut pixels) = if blackout.classes().is_empty() && blackout.titles().is_empty() {
        read()?
    } else {
        session.grabbed(read)?
    };
    for rect in &blacked.rects {
        pixels.fill_black(
            rect.x - i64::from(x),
            rect.y - i64::from(y),
            rect.width,
            rect.height,
        );
    }
    let (w, h) = image::fit(width, height, size);
    Ok((image::scale_down(pixels, w, h), blacked.meets(area)))
}

/// The handle handlers send their actions through; cheap to clone.
#[derive(Clone)]
pub struct DeskHandle {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for DeskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeskHandle").finish_non_exhaustive()
    }
}

impl DeskHandle {
    /// Starts the thread for `display`; it connects at once and keeps
    /// trying every second while the display is not there. The thread ends
    /// when the last handle is dropped.
    pub fn start(
        display: String,
        blackout: Blackout,
        size: Size,
        root_clicks: bool,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dk-desktop-x11".to_owned())
            .spawn(move || {
                let mut desk = Desk {
                    display,
                    session: None,
                    lost: false,
                    blackout,
                    size,
                    root_clicks,
                };
                if !desk.connect() {
                    tracing::warn!(
                        display = %desk.display,
                        "the X display is not reachable; connecting again every second"
                    );
                }
                loop {
                    match queue.recv_timeout(RECONNECT_EVERY) {
                        Ok(job) => job(&mut desk),
                        Err(mpsc::RecvTimeoutError::Timeout) => desk.tend(),
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            if let Some(session) = &desk.session {
                                let _ = session.give_back_spares(true);
                            }
                            return;
                        }
                    }
                }
            })?;
        Ok(DeskHandle { jobs })
    }

    /// Runs `act` on the thread and waits for its answer.
    pub async fn run<T: Send + 'static>(
        &self,
        act: impl FnOnce(&mut Desk) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |desk| {
            let _ = answer.send(act(desk));
        });
        if self.jobs.send(job).is_err() {
            return Err(Refusal("the device's X thread has stopped".to_owned()));
        }
        answered
            .await
            .unwrap_or_else(|_| Err(Refusal("the device's X thread has stopped".to_owned())))
    }
}
