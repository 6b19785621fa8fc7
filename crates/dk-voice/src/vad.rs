//! Voice activity detection by energy with a hangover: a frame (20 ms) is
//! sound when its level is at or above a threshold (-45 dBFS unless
//! configured); once sound was heard, a run of quiet frames as long as the
//! hangover (800 ms unless configured) ends the recording. Nothing heard at
//! all within the patience (5 s unless configured) ends it too. Simple and
//! predictable: no model, no adaptation, so the person and the tests know
//! exactly when `listen` stops.

use std::time::Duration;

use crate::audio::{FRAME_MS, level_dbfs};

/// The level at or above which a frame is sound, by default.
pub const DEFAULT_THRESHOLD_DBFS: f64 = -45.0;
/// Quiet after sound that ends a recording, by default.
pub const DEFAULT_HANGOVER: Duration = Duration::from_millis(800);
/// Quiet from the start that ends a recording, by default.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(5);

/// Why the detector ended a recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Quiet for the hangover after sound.
    Silence,
    /// Nothing heard within the patience.
    NothingHeard,
}

/// The detector's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadSettings {
    /// A frame at or above this level (dBFS) is sound.
    pub threshold_dbfs: f64,
    /// Quiet after sound that ends a recording.
    pub hangover: Duration,
    /// Quiet from the start that ends a recording.
    pub patience: Duration,
}

impl Default for VadSettings {
    fn default() -> Self {
        VadSettings {
            threshold_dbfs: DEFAULT_THRESHOLD_DBFS,
            hangover: DEFAULT_HANGOVER,
            patience: DEFAULT_PATIENCE,
        }
    }
}

/// One recording's detector: fed frame by frame.
#[derive(Debug, Clone)]
pub struct Vad {
    settings: VadSettings,
    heard: bool,
    quiet_frames: u64,
}

fn frames_of(span: Duration) -> u64 {
    (span.as_millis() as u64)
        .div_ceil(u64::from(FRAME_MS))
        .max(1)
}

impl Vad {
    /// A detector that has heard nothing yet.
    pub fn new(settings: VadSettings) -> Self {
        Vad {
            settings,
            heard: false,
            quiet_frames: 0,
        }
    }

    /// Whether sound was heard.
    pub fn heard(&self) -> bool {
        self.heard
    }

    /// Takes one frame; `Some` when the recording ends with it.
    pub fn push(&mut self, frame: &[i16]) -> Option<Ended> {
        if level_dbfs(frame) >= self.settings.threshold_dbfs {
            self.heard = true;
            self.quiet_frames = 0;
            return None;
        }
        self.quiet_frames = self.quiet_frames.saturating_add(1);
        if self.heard && self.quiet_frames >= frames_of(self.settings.hangover) {
            Some(Ended::Silence)
        } else if !self.heard && self.quiet_frames >= frames_of(self.settings.patience) {
            Some(Ended::NothingHeard)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::FRAME_SAMPLES;

    #[test]
    fn sound_then_the_hangover_of_quiet_ends() {
        let loud = vec![8000i16; FRAME_SAMPLES];
        let quiet = vec![3i16; FRAME_SAMPLES];
        let mut vad = Vad::new(VadSettings::default());
        for _ in 0..10 {
            assert_eq!(vad.push(&loud), None);
        }
        // 800 ms is 40 frames: the 40th quiet frame ends it.
        for _ in 0..39 {
            assert_eq!(vad.push(&quiet), None);
        }
        assert_eq!(vad.push(&quiet), Some(Ended::Silence));
        // Sound again resets the count.
        let mut vad = Vad::new(VadSettings::default());
        vad.push(&loud);
        for _ in 0..30 {
            vad.push(&quiet);
        }
        assert_eq!(vad.push(&loud), None);
        for _ in 0..39 {
            assert_eq!(vad.push(&quiet), None);
        }
        assert_eq!(vad.push(&quiet), Some(Ended::Silence));
    }

    #[test]
    fn nothing_heard_ends_after_the_patience() {
        let mut vad = Vad::new(VadSettings {
            patience: Duration::from_millis(100),
            ..VadSettings::default()
        });
        let quiet = vec![0i16; FRAME_SAMPLES];
        for _ in 0..4 {
            assert_eq!(vad.push(&quiet), None);
        }
        assert_eq!(vad.push(&quiet), Some(Ended::NothingHeard));
        assert!(!vad.heard());
    }
}
