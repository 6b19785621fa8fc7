//! Replies in chunks: a reply larger than one message (a routed
//! screenshot, a member's whole set of devices) goes as several, each
//! sealed on its own, and is put back together in order by the member that
//! asked. A chunk's head: its status (one byte), its index and the count
//! (four bytes each, big-endian).

/// The largest reply a member sends or takes, in bytes, whatever the
/// servers' message size.
pub const MAX_REPLY: usize = 16 * 1024 * 1024;

/// Most chunks of one reply.
const MAX_CHUNKS: u32 = 4096;

/// What a reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// The reply itself.
    Data,
    /// The request was meant for an earlier incarnation of the member
    /// asked: it restarted, and refuses it.
    Stale,
}

/// One chunk of a reply, as read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Chunk<'a> {
    pub(crate) status: Status,
    index: u32,
    count: u32,
    data: &'a [u8],
}

impl<'a> Chunk<'a> {
    /// The bytes of a chunk's head.
    pub(crate) const HEAD: usize = 9;

    /// The chunk `bytes` hold, or `Err` when they hold none.
    pub(crate) fn read(bytes: &'a [u8]) -> Result<Chunk<'a>, ()> {
        let (&status, rest) = bytes.split_first().ok_or(())?;
        let (index, rest) = rest.split_at_checked(4).ok_or(())?;
        let (count, data) = rest.split_at_checked(4).ok_or(())?;
        let status = match status {
            0 => Status::Data,
            1 => Status::Stale,
            _ => return Err(()),
        };
        let index = u32::from_be_bytes(index.try_into().map_err(|_| ())?);
        let count = u32::from_be_bytes(count.try_into().map_err(|_| ())?);
        if count == 0 || count > MAX_CHUNKS || index >= count {
            return Err(());
        }
        Ok(Chunk {
            status,
            index,
            count,
            data,
        })
    }
}

/// `reply` as chunks of at most `room` bytes of data each, heads included;
/// `None` when it is larger than [`MAX_REPLY`] or needs more chunks than
/// a reply may have.
pub(crate) fn chunks(reply: &[u8], room: usize, status: Status) -> Option<Vec<Vec<u8>>> {
    if reply.len() > MAX_REPLY || room == 0 {
        return None;
    }
    let pieces: Vec<&[u8]> = if reply.is_empty() {
        vec![&[]]
    } else {
        reply.chunks(room).collect()
    };
    let count = u32::try_from(pieces.len())
        .ok()
        .filter(|c| *c <= MAX_CHUNKS)?;
    let status = match status {
        Status::Data => 0u8,
        Status::Stale => 1,
    };
    Some(
        pieces
            .into_iter()
            .zip(0u32..)
            .map(|(data, index)| {
                let mut chunk = Vec::with_capacity(Chunk::HEAD + data.len());
                chunk.push(status);
                chunk.extend_from_slice(&index.to_be_bytes());
                chunk.extend_from_slice(&count.to_be_bytes());
                chunk.extend_from_slice(data);
                chunk
            })
            .collect(),
    )
}

/// A reply being put back together.
#[derive(Debug, Default)]
pub(crate) struct Assembly {
    parts: Vec<Option<Vec<u8>>>,
    have: usize,
    bytes: usize,
}

impl Assembly {
    /// Takes `chunk`: the whole reply once every chunk came, `Ok(None)`
    /// while some are missing, `Err` when the chunks disagree (on their
    /// count, or one came twice) or add up to more than [`MAX_REPLY`].
    pub(crate) fn take(&mut self, chunk: Chunk<'_>) -> Result<Option<Vec<u8>>, ()> {
        let count = usize::try_from(chunk.count).map_err(|_| ())?;
        let index = usize::try_from(chunk.index).map_err(|_| ())?;
        if self.parts.is_empty() {
            self.parts = vec![None; count];
        } else if self.parts.len() != count {
            return Err(());
        }
        self.bytes += chunk.data.len();
        if self.bytes > MAX_REPLY {
            return Err(());
        }
        let slot = self.parts.get_mut(index).ok_or(())?;
        if slot.is_some() {
            return Err(());
        }
        *slot = Some(chunk.data.to_vec());
        self.have += 1;
        if self.have < count {
            return Ok(None);
        }
        let mut whole = Vec::with_capacity(self.bytes);
        for part in self.parts.drain(..).flatten() {
            whole.extend_from_slice(&part);
        }
        Ok(Some(whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(reply: &[u8], room: usize, order: impl Fn(usize, usize) -> usize) -> Vec<u8> {
        let pieces = chunks(reply, room, Status::Data).unwrap();
        let mut assembly = Assembly::default();
        let n = pieces.len();
        let mut out = None;
        for i in 0..n {
            let chunk = Chunk::read(&pieces[order(i, n)]).unwrap();
            assert!(out.is_none());
            out = assembly.take(chunk).unwrap();
        }
        out.unwrap()
    }

    #[test]
    fn replies_come_back_whole_in_any_order() {
        let reply: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
        let along = |i, _| i;
        assert_eq!(round_trip(&reply, 64 * 1024, along), reply);
        assert_eq!(round_trip(&reply, 1000, |i, n| n - 1 - i), reply);
        assert_eq!(round_trip(b"", 10, along), b"");
        assert_eq!(round_trip(b"short", 10, along), b"short");
    }

    #[test]
    fn bad_chunks_and_too_much_are_refused() {
        assert_eq!(
            chunks(&vec![0; MAX_REPLY + 1], 1024 * 1024, Status::Data),
            None
        );
        assert_eq!(chunks(&vec![0; 5000], 1, Status::Data), None);
        assert_eq!(chunks(b"x", 0, Status::Data), None);
        for bad in [
            &[][..],
            &[0, 0, 0, 0, 0, 0, 0, 0],
            &[0, 0, 0, 0, 1, 0, 0, 0, 1], // index == count
            &[0, 0, 0, 0, 0, 0, 0, 0, 0], // count 0
            &[9, 0, 0, 0, 0, 0, 0, 0, 1], // unknown status
        ] {
            assert_eq!(Chunk::read(bad), Err(()), "{bad:?}");
        }
        let pieces = chunks(b"abcdef", 2, Status::Data).unwrap();
        let mut assembly = Assembly::default();
        assembly.take(Chunk::read(&pieces[0]).unwrap()).unwrap();
        // The same chunk twice.
        assert_eq!(assembly.take(Chunk::read(&pieces[0]).unwrap()), Err(()));
        // Another count.
        let other = chunks(b"abcdefgh", 2, Status::Data).unwrap();
        let mut assembly = Assembly::default();
        assembly.take(Chunk::read(&pieces[1]).unwrap()).unwrap();
        assert_eq!(assembly.take(Chunk::read(&other[0]).unwrap()), Err(()));
        let stale = chunks(b"", 10, Status::Stale).unwrap();
        assert_eq!(Chunk::read(&stale[0]).unwrap().status, Status::Stale);
    }
}
