//! The library's reserve: memory of its own, in its data rather than the
//! platform's heap, that answers the small allocations the platform
//! refuses. Rust's collections and serde_json cannot take a refusal (an
//! allocation that returns NULL aborts), so a refused small allocation is
//! answered from here instead, and the library call it happened in ends
//! its connection, which frees what the connection held, and returns
//! `DK_ERR_NO_MEMORY`. Large allocations, the frame-sized buffers a peer's
//! input makes, are asked for without aborting where they are made
//! (`try_reserve`) and are never answered from the reserve.
//!
//! The reserve is [`RESERVE_BYTES`] bytes in units of [`UNIT`] bytes, one
//! bit each in a map, taken first-fit under a spin lock: blocks freed in any
//! order are taken again.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// The reserve's size, in bytes.
pub(crate) const RESERVE_BYTES: usize = crate::abi::DK_RESERVE_BYTES;

/// The largest allocation the reserve answers, in bytes; a larger one the
/// platform refused gets NULL.
pub(crate) const PIECE_BYTES: usize = 2 * 1024;

/// The largest alignment the reserve answers.
const MAX_ALIGN: usize = 64;

/// The reserve is taken in units of this many bytes.
const UNIT: usize = 16;

const UNITS: usize = RESERVE_BYTES / UNIT;
const WORDS: usize = UNITS / 32;

const _: () = assert!(UNITS.is_multiple_of(32) && MAX_ALIGN.is_multiple_of(UNIT));

/// The reserve's bytes, aligned for the largest alignment it answers.
#[repr(C, align(64))]
struct Arena(UnsafeCell<[u8; RESERVE_BYTES]>);

// SAFETY: the bytes are never read or written here: they are handed out in
// blocks that do not overlap (the map, under the lock, says which units are
// taken), each then used by the one owner it was given to.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena(UnsafeCell::new([0; RESERVE_BYTES]));

/// One bit a unit, set when taken. Read and written under `LOCK`.
static TAKEN: [AtomicU32; WORDS] = [const { AtomicU32::new(0) }; WORDS];

/// Held while the map is read or written.
static LOCK: AtomicBool = AtomicBool::new(false);

/// Units taken now, and the most ever taken at once.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);

fn base() -> usize {
    ARENA.0.get() as usize
}

/// Whether `block` is in the reserve.
pub(crate) fn holds(block: *mut u8) -> bool {
    let at = block as usize;
    at >= base() && at < base() + RESERVE_BYTES
}

/// Runs `f` with the map to itself.
fn locked<T>(f: impl FnOnce() -> T) -> T {
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    let result = f();
    LOCK.store(false, Ordering::Release);
    result
}

fn is_taken(unit: usize) -> bool {
    TAKEN
        .get(unit / 32)
        .is_some_and(|word| word.load(Ordering::Relaxed) & (1 << (unit % 32)) != 0)
}

fn mark(units: core::ops::Range<usize>, taken: bool) {
    for unit in units {
        if let Some(word) = TAKEN.get(unit / 32) {
            let bit = 1 << (unit % 32);
            if taken {
                word.fetch_or(bit, Ordering::Relaxed);
            } else {
                word.fetch_and(!bit, Ordering::Relaxed);
            }
        }
    }
}

/// A block of `size` bytes aligned to `align` from the reserve, or NULL
/// when it is larger than [`PIECE_BYTES`], more aligned than the reserve
/// is, or no run of free units is long enough.
pub(crate) fn take(size: usize, align: usize) -> *mut u8 {
    if size == 0 || size > PIECE_BYTES || align > MAX_ALIGN {
        return core::ptr::null_mut();
    }
    let units = size.div_ceil(UNIT);
    let step = align.div_ceil(UNIT).max(1);
    let start = locked(|| {
        let start = (0..UNITS)
            .step_by(step)
            .find(|&start| start + units <= UNITS && !(start..start + units).any(is_taken))?;
        mark(start..start + units, true);
        Some(start)
    });
    let Some(start) = start else {
        return core::ptr::null_mut();
    };
    let now = IN_USE.fetch_add(units, Ordering::Relaxed) + units;
    MOST.fetch_max(now, Ordering::Relaxed);
    ARENA.0.get().cast::<u8>().wrapping_add(start * UNIT)
}

/// Gives back a block [`take`] gave, with the size it was asked with.
pub(crate) fn give_back(block: *mut u8, size: usize) {
    let start = (block as usize - base()) / UNIT;
    let units = size.div_ceil(UNIT);
    locked(|| mark(start..start + units, false));
    IN_USE.fetch_sub(units, Ordering::Relaxed);
}

/// Bytes of the reserve in use now.
#[cfg(test)]
pub(crate) fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed) * UNIT
}

/// The most bytes of the reserve in use at once since the last
/// [`reset_most`].
#[cfg(test)]
pub(crate) fn most_used() -> usize {
    MOST.load(Ordering::Relaxed) * UNIT
}

/// Starts [`most_used`] again from what is in use now.
#[cfg(test)]
pub(crate) fn reset_most() {
    MOST.store(IN_USE.load(Ordering::Relaxed), Ordering::Relaxed);
}
