//! A buffer a log writer writes into, shared with the test that reads it.

use std::io::{self, Write};
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes written through any of its clones, read back with
/// [`text`](LogBuffer::text): what a formatter or a redacting writer
/// produced.
#[derive(Clone, Default, Debug)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Everything written so far, as bytes.
    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Everything written so far, as text.
    ///
    /// # Panics
    ///
    /// When what was written is not UTF-8: a log line always is.
    #[must_use]
    pub fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        #[expect(
            clippy::expect_used,
            reason = "a test's log is text; anything else fails the test"
        )]
        String::from_utf8(bytes).expect("the log is UTF-8")
    }
}

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_clone_writes_the_original_reads() {
        let log = LogBuffer::default();
        let mut writer = log.clone();
        writer.write_all(b"one ").unwrap();
        write!(writer, "two").unwrap();
        writer.flush().unwrap();
        assert_eq!(log.text(), "one two");
        assert_eq!(log.bytes(), b"one two");
    }
}
