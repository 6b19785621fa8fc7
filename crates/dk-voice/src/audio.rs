//! Audio as the device keeps it: 16 kHz mono 16-bit PCM. WAV written and
//! read (read strictly, every length checked against the bytes there are
//! before anything is taken), the conversion of other rates and of stereo
//! to it, a level in dBFS, and the hash the audit log keeps instead of the
//! sound.

use sha2::{Digest, Sha256};

/// Samples a second, inside the device and in every WAV it sends.
pub const RATE: u32 = 16_000;
/// Milliseconds of one frame: what is read from the source at a time, and
/// the step of voice activity detection.
pub const FRAME_MS: u32 = 20;
/// Samples of one frame.
pub const FRAME_SAMPLES: usize = (RATE * FRAME_MS / 1000) as usize;
/// Lowest sample rate a played WAV may have.
pub const MIN_PLAY_RATE: u32 = 8_000;
/// Highest sample rate a played WAV may have.
pub const MAX_PLAY_RATE: u32 = 48_000;
/// The quietest level reported, in dBFS (digital silence).
pub const FLOOR_DBFS: f64 = -96.0;
/// Bytes of the WAV header written here.
pub const WAV_HEADER: usize = 44;

/// Why audio given to play was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AudioError {
    /// Neither WAV nor Ogg.
    #[error("the audio is not WAV (RIFF WAVE) or Opus (Ogg)")]
    NotAudio,
    /// Ogg Opus, which this build does not decode.
    #[error("Opus audio is not played by this device: send 16-bit PCM WAV")]
    Opus,
    /// A chunk's length runs past the end of the bytes.
    #[error("the WAV is cut short: its {chunk} chunk says {said} bytes and {there} follow")]
    Truncated {
        /// The chunk's id.
        chunk: String,
        /// The length its header says.
        said: u64,
        /// The bytes there are after the header.
        there: u64,
    },
    /// No `fmt ` chunk before the `data` chunk, or none at all.
    #[error("the WAV has no fmt chunk before its data")]
    NoFormat,
    /// No `data` chunk.
    #[error("the WAV has no data chunk")]
    NoData,
    /// A format other than 16-bit PCM, one or two channels.
    #[error(
        "the WAV is {bits}-bit with {channels} channels (format {format}); 16-bit PCM in one or two channels is played"
    )]
    Format {
        /// The format tag (1 is PCM).
        format: u16,
        /// Channels.
        channels: u16,
        /// Bits a sample.
        bits: u16,
    },
    /// A sample rate out of bounds.
    #[error("the WAV's rate is {0} Hz; {MIN_PLAY_RATE} to {MAX_PLAY_RATE} Hz is played")]
    Rate(u32),
    /// Longer than the device plays at once.
    #[error("the audio lasts {seconds:.1} s; at most {max} s is played at once")]
    TooLong {
        /// Its length, in seconds.
        seconds: f64,
        /// The most played.
        max: u32,
    },
}

/// `samples` as a WAV file: RIFF WAVE, PCM, 16 kHz, one channel, 16 bits.
pub fn wav(samples: &[i16]) -> Vec<u8> {
    let data_len = u32::try_from(samples.len().saturating_mul(2)).unwrap_or(u32::MAX - 1);
    let mut out = Vec::with_capacity(WAV_HEADER + samples.len() * 2);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&data_len.saturating_add(36).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&RATE.to_le_bytes());
    out.extend_from_slice(&(RATE * 2).to_le_bytes()); // bytes a second
    out.extend_from_slice(&2u16.to_le_bytes()); // bytes a frame
    out.extend_from_slice(&16u16.to_le_bytes()); // bits
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for sample in samples.iter().take(data_len as usize / 2) {
        out.extend_from_slice(&sample.to_le_bytes());
    }
    out
}

/// Little-endian PCM bytes as samples (an odd last byte is left out).
pub fn samples(pcm: &[u8]) -> Vec<i16> {
    pcm.chunks_exact(2)
        .map(|pair| match pair {
            [lo, hi] => i16::from_le_bytes([*lo, *hi]),
            _ => 0,
        })
        .collect()
}

/// Samples as little-endian PCM bytes.
pub fn pcm(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    match bytes.get(at..at + 2) {
        Some(&[a, b]) => u16::from_le_bytes([a, b]),
        _ => 0,
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    match bytes.get(at..at + 4) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// A WAV's sound as the device plays it: 16 kHz mono samples, no longer
/// than `max_seconds`. Reads `fmt ` and `data` among other chunks, each
/// chunk's length checked against the bytes that follow it.
pub fn read_wav(bytes: &[u8], max_seconds: u32) -> Result<Vec<i16>, AudioError> {
    if bytes.starts_with(b"OggS") {
        return Err(AudioError::Opus);
    }
    if !(bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WAVE".as_slice())) {
        return Err(AudioError::NotAudio);
    }
    let mut at = 12usize;
    let mut format: Option<(u16, u16, u32, u16)> = None;
    while at < bytes.len() {
        let id = bytes.get(at..at + 4).ok_or(AudioError::NoData)?;
        let said = u32_at(bytes, at + 4);
        let body = at + 8;
        let there = bytes.len().saturating_sub(body);
        let chunk = String::from_utf8_lossy(id).trim_end().to_owned();
        let len = usize::try_from(said).unwrap_or(usize::MAX);
        if id == b"data" {
            let (tag, channels, rate, bits) = format.ok_or(AudioError::NoFormat)?;
            if len > there {
                return Err(AudioError::Truncated {
                    chunk,
                    said: u64::from(said),
                    there: there as u64,
                });
            }
            if !(tag == 1 || tag == 0xFFFE) || bits != 16 || !(1..=2).contains(&channels) {
                return Err(AudioError::Format {
                    format: tag,
                    channels,
                    bits,
                });
            }
            if !(MIN_PLAY_RATE..=MAX_PLAY_RATE).contains(&rate) {
                return Err(AudioError::Rate(rate));
            }
            let frames = len / (2 * usize::from(channels));
            let seconds = frames as f64 / f64::from(rate);
            if seconds > f64::from(max_seconds) {
                return Err(AudioError::TooLong {
                    seconds,
                    max: max_seconds,
                });
            }
            let data = bytes.get(body..body + len).unwrap_or_default();
            let interleaved = samples(data);
            let mono: Vec<i16> = if channels == 2 {
                interleaved
                    .chunks_exact(2)
                    .map(|pair| match pair {
                        [l, r] => ((i32::from(*l) + i32::from(*r)) / 2) as i16,
                        _ => 0,
                    })
                    .collect()
            } else {
                interleaved
            };
            return Ok(resample(&mono, rate, RATE));
        }
        if len > there {
            return Err(AudioError::Truncated {
                chunk,
                said: u64::from(said),
                there: there as u64,
            });
        }
        if id == b"fmt " {
            if len < 16 {
                return Err(AudioError::NoFormat);
            }
            format = Some((
                u16_at(bytes, body),
                u16_at(bytes, body + 2),
                u32_at(bytes, body + 4),
                u16_at(bytes, body + 14),
            ));
        }
        // Chunks are padded to an even length.
        at = body.saturating_add(len).saturating_add(len & 1);
    }
    Err(AudioError::NoData)
}

/// `samples` at `from` Hz as samples at `to` Hz, by linear interpolation
/// (enough for speech and tones; no filter against aliasing).
pub fn resample(samples: &[i16], from: u32, to: u32) -> Vec<i16> {
    if from == to || from == 0 || to == 0 || samples.is_empty() {
        return samples.to_vec();
    }
    let out_len = (samples.len() as u64 * u64::from(to) / u64::from(from)) as usize;
    let step = f64::from(from) / f64::from(to);
    (0..out_len)
        .map(|i| {
            let position = i as f64 * step;
            let index = position as usize;
            let fraction = position - index as f64;
            let a = f64::from(samples.get(index).copied().unwrap_or(0));
            let b = f64::from(samples.get(index + 1).copied().unwrap_or(a as i16));
            (a + (b - a) * fraction).round() as i16
        })
        .collect()
}

/// The root mean square level of `samples` in dBFS (0 is a full-scale
/// square wave), at least [`FLOOR_DBFS`].
pub fn level_dbfs(samples: &[i16]) -> f64 {
    if samples.is_empty() {
        return FLOOR_DBFS;
    }
    let sum: f64 = samples
        .iter()
        .map(|&s| {
            let v = f64::from(s) / 32768.0;
            v * v
        })
        .sum();
    let rms = (sum / samples.len() as f64).sqrt();
    if rms <= 0.0 {
        FLOOR_DBFS
    } else {
        (20.0 * rms.log10()).max(FLOOR_DBFS)
    }
}

/// A level rounded to a tenth of a dB, for results and the log.
pub fn round_level(dbfs: f64) -> f64 {
    (dbfs * 10.0).round() / 10.0
}

/// The SHA-256 of `bytes` in lower-case hex: what is kept of a sound.
pub fn sha256_hex(bytes: &[u8]) -> String {
    dk_files::hex::encode(&Sha256::digest(bytes))
}

/// Milliseconds `samples` last at [`RATE`].
pub fn duration_ms(samples: usize) -> u64 {
    samples as u64 * 1000 / u64::from(RATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(hz: f64, samples: usize, rate: u32) -> Vec<i16> {
        (0..samples)
            .map(|i| {
                (8000.0 * (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin())
                    as i16
            })
            .collect()
    }

    fn wav_of(format: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&format.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * u32::from(channels) * u32::from(bits) / 8).to_le_bytes());
        out.extend_from_slice(&(channels * bits / 8).to_le_bytes());
        out.extend_from_slice(&bits.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn wav_round_trips() {
        let sound = tone(440.0, 1600, RATE);
        let file = wav(&sound);
        assert_eq!(file.len(), WAV_HEADER + 3200);
        assert_eq!(read_wav(&file, 30), Ok(sound));
        assert_eq!(read_wav(&wav(&[]), 30), Ok(vec![]));
    }

    #[test]
    fn other_rates_and_stereo_become_16k_mono() {
        let sound = tone(440.0, 4410, 44_100);
        let stereo: Vec<i16> = sound.iter().flat_map(|&s| [s, s]).collect();
        let read = read_wav(&wav_of(1, 2, 44_100, 16, &pcm(&stereo)), 30);
        assert_eq!(read.as_ref().map(Vec::len), Ok(1600));
    }

    #[test]
    fn bad_wavs_are_refused_clearly() {
        let data = pcm(&tone(440.0, 160, RATE));
        let good = wav_of(1, 1, RATE, 16, &data);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"hello".to_vec(),
                "the audio is not WAV (RIFF WAVE) or Opus (Ogg)",
            ),
            (
                b"OggS\0\x02".to_vec(),
                "Opus audio is not played by this device: send 16-bit PCM WAV",
            ),
            (
                good[..60].to_vec(),
                "the WAV is cut short: its data chunk says 320 bytes and 16 follow",
            ),
            (good[..12].to_vec(), "the WAV has no data chunk"),
            (good[..14].to_vec(), "the WAV has no data chunk"),
            (
                wav_of(3, 1, RATE, 32, &data),
                "the WAV is 32-bit with 1 channels (format 3); 16-bit PCM in one or two channels is played",
            ),
            (
                wav_of(1, 6, RATE, 16, &data),
                "the WAV is 16-bit with 6 channels (format 1); 16-bit PCM in one or two channels is played",
            ),
            (
                wav_of(1, 1, 96_000, 16, &data),
                "the WAV's rate is 96000 Hz; 8000 to 48000 Hz is played",
            ),
            (
                wav_of(1, 1, RATE, 16, &pcm(&tone(1.0, 16_000 * 3, RATE))),
                "the audio lasts 3.0 s; at most 2 s is played at once",
            ),
        ];
        for (bytes, why) in cases {
            let read = read_wav(&bytes, 2).map_err(|e| e.to_string());
            assert_eq!(read, Err(why.to_owned()));
        }
        // A header that claims four gigabytes.
        let mut huge = good.clone();
        huge[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            read_wav(&huge, 30).map_err(|e| e.to_string()),
            Err(
                "the WAV is cut short: its data chunk says 4294967295 bytes and 320 follow"
                    .to_owned()
            )
        );
        // A fmt chunk that claims more than there is.
        let mut long_fmt = good.clone();
        long_fmt[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_wav(&long_fmt, 30),
            Err(AudioError::Truncated { .. })
        ));
        // Data before any fmt.
        let mut no_fmt = b"RIFF\0\0\0\0WAVEdata\x02\0\0\0\0\0".to_vec();
        no_fmt.extend_from_slice(&[0; 4]);
        assert_eq!(read_wav(&no_fmt, 30), Err(AudioError::NoFormat));
    }

    #[test]
    fn levels() {
        assert_eq!(level_dbfs(&[]), FLOOR_DBFS);
        assert_eq!(level_dbfs(&[0; 100]), FLOOR_DBFS);
        assert_eq!(round_level(level_dbfs(&[i16::MIN; 100])), 0.0);
        // A sine of amplitude 8000: 20 log10(8000 / 32768 / sqrt 2) = -15.3.
        assert_eq!(round_level(level_dbfs(&tone(440.0, 16_000, RATE))), -15.3);
        assert_eq!(duration_ms(16_000), 1000);
        assert_eq!(sha256_hex(b"").len(), 64);
    }
}
