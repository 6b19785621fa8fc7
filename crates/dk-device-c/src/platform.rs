//! What the platform gives: memory (the global allocator), random bytes,
//! a log; and, in the firmware build, the panic handler.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::{c_char, c_void};
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use dk_device_core::{Entropy, EntropyFailed};

use crate::abi::{dk_call, dk_reply, dk_status};
use crate::reserve;

/// Allocates `size` bytes aligned to `align` (a power of two), or returns
/// NULL when there is no memory. `ctx` is the platform's.
pub type dk_alloc_fn =
    Option<unsafe extern "C" fn(size: usize, align: usize, ctx: *mut c_void) -> *mut c_void>;

/// Frees what the allocation callback returned, with the same `size` and
/// `align`.
pub type dk_free_fn =
    Option<unsafe extern "C" fn(ptr: *mut c_void, size: usize, align: usize, ctx: *mut c_void)>;

/// Fills `len` bytes at `buf` with unpredictable random bytes (a hardware
/// generator, the operating system's); returns false when it cannot.
pub type dk_random_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, buf: *mut u8, len: usize) -> bool>;

/// Receives one line for the device's log: `len` bytes of UTF-8 at `text`,
/// NUL-terminated, valid only during the call.
pub type dk_log_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, text: *const c_char, len: usize)>;

/// Runs a call of the capability it was registered for: `call` names it
/// and carries its input (valid only during the handler). The handler
/// answers through `reply` (`dk_reply_ok`,
/// `dk_reply_error`) before it returns, or later
/// with `dk_device_answer` and the call's id.
/// It may emit events and answer calls; a device it frees is freed once it
/// returns (the poll then returns false).
pub type dk_handler_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, call: *const dk_call, reply: *mut dk_reply)>;

/// The platform's callbacks, each given `ctx` back.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dk_platform {
    /// Handed back to every callback.
    pub ctx: *mut c_void,
    /// Random bytes (required).
    pub random: dk_random_fn,
    /// Memory (required, with `free`): registered once for the whole
    /// library by `dk_platform_init` or the first device made.
    pub alloc: dk_alloc_fn,
    /// Frees memory from `alloc` (required).
    pub free: dk_free_fn,
    /// The device's log (optional, may be NULL): notices (frames set aside,
    /// a close not announced in the channel) go here instead of out of
    /// `dk_device_poll`.
    pub log: dk_log_fn,
}

/// No allocator yet; one being registered; one registered.
const NONE: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(NONE);
static ALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static FREE: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static CTX: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Registers the platform's allocation callbacks for the whole library,
/// once, before anything else (the first `dk_device_new`
/// does it too). Until then every allocation fails. The callbacks are
/// given the `ctx` of that first registration, always. Registering the
/// same callbacks again is `DK_OK` (whatever the `ctx`); others are
/// refused with
/// `DK_ERR_PLATFORM` (memory already given out must go back where it came
/// from), as is a platform without both callbacks.
///
/// # Safety
///
/// `platform` is NULL or points to a readable `dk_platform`; its callbacks
/// behave as their types say for as long as the library is used.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_platform_init(platform: *const dk_platform) -> dk_status {
    // SAFETY: the caller passes NULL or a readable dk_platform.
    let Some(platform) = (unsafe { platform.as_ref() }) else {
        return dk_status::DK_ERR_NULL;
    };
    register(platform)
}

pub(crate) fn register(platform: &dk_platform) -> dk_status {
    let (Some(alloc), Some(free)) = (platform.alloc, platform.free) else {
        return dk_status::DK_ERR_PLATFORM;
    };
    let (alloc, free) = (alloc as *mut (), free as *mut ());
    let mut state = STATE.compare_exchange(NONE, REGISTERING, Ordering::AcqRel, Ordering::Acquire);
    // A second caller racing the first waits for its callbacks to be in
    // place before comparing them: the window is three stores long.
    while state == Err(REGISTERING) {
        core::hint::spin_loop();
        state = Err(STATE.load(Ordering::Acquire));
    }
    match state {
        Ok(_) => {
            FREE.store(free, Ordering::Relaxed);
            CTX.store(platform.ctx, Ordering::Relaxed);
            ALLOC.store(alloc, Ordering::Relaxed);
            STATE.store(REGISTERED, Ordering::Release);
            dk_status::DK_OK
        }
        Err(REGISTERED)
            if ALLOC.load(Ordering::Relaxed) == alloc && FREE.load(Ordering::Relaxed) == free =>
        {
            dk_status::DK_OK
        }
        Err(_) => dk_status::DK_ERR_PLATFORM,
    }
}

/// How many allocations the platform has refused since the library
/// started: a library call that sees it move ran out of memory.
static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// How many allocations the platform has refused so far.
pub(crate) fn refusals() -> usize {
    REFUSED.load(Ordering::Relaxed)
}

/// The global allocator of the firmware build: the platform's callbacks,
/// NULL (no memory) before they are registered. An allocation the platform
/// refuses is counted and, when it is small, answered from
/// the library's reserve, so that nothing that cannot take a refusal gets
/// one; a large one gets NULL (the library asks for those with
/// `try_reserve`).
#[derive(Debug, Clone, Copy)]
pub struct PlatformAllocator;

type AllocFn = unsafe extern "C" fn(usize, usize, *mut c_void) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void, usize, usize, *mut c_void);

// SAFETY: memory comes from the platform's allocation callback with the
// layout's size and alignment (its contract), and goes back to the free
// callback with the same layout; nothing is handed out before both are
// registered, and they never change once registered.
unsafe impl GlobalAlloc for PlatformAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if STATE.load(Ordering::Acquire) != REGISTERED {
            return ptr::null_mut();
        }
        let alloc = ALLOC.load(Ordering::Relaxed);
        // SAFETY: ALLOC holds a `dk_alloc_fn`'s function pointer, stored by
        // `register` before STATE became REGISTERED.
        let alloc: AllocFn = unsafe { core::mem::transmute::<*mut (), AllocFn>(alloc) };
        // SAFETY: the platform's callback, called as its type says.
        let block: *mut u8 =
            unsafe { alloc(layout.size(), layout.align(), CTX.load(Ordering::Relaxed)) }.cast();
        if !block.is_null() {
            return block;
        }
        REFUSED.fetch_add(1, Ordering::Relaxed);
        reserve::take(layout.size(), layout.align())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if reserve::holds(ptr) {
            return reserve::give_back(ptr, layout.size());
        }
        if STATE.load(Ordering::Acquire) != REGISTERED {
            return;
        }
        let free = FREE.load(Ordering::Relaxed);
        // SAFETY: FREE holds a `dk_free_fn`'s function pointer, stored by
        // `register` before STATE became REGISTERED.
        let free: FreeFn = unsafe { core::mem::transmute::<*mut (), FreeFn>(free) };
        // SAFETY: `ptr` came from the alloc callback with this layout.
        unsafe {
            free(
                ptr.cast(),
                layout.size(),
                layout.align(),
                CTX.load(Ordering::Relaxed),
            )
        }
    }
}

#[cfg(all(not(test), panic = "abort"))]
#[global_allocator]
static ALLOCATOR: PlatformAllocator = PlatformAllocator;

#[cfg(all(not(test), panic = "abort"))]
unsafe extern "C" {
    fn abort() -> !;
}

/// No input makes the core panic; were it to, the firmware stops rather
/// than run on in a state nobody checked.
#[cfg(all(not(test), panic = "abort"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // SAFETY: the C library's abort takes nothing and does not return.
    unsafe { abort() }
}

/// The personality routine unwinding tables name: core is built to
/// unwind, this library aborts instead, so nothing ever calls it.
#[cfg(all(not(test), panic = "abort"))]
#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() {}

/// The platform's random bytes, for the core.
pub(crate) struct PlatformRandom {
    pub(crate) random: unsafe extern "C" fn(*mut c_void, *mut u8, usize) -> bool,
    pub(crate) ctx: *mut c_void,
}

// SAFETY: a device and its callbacks' context are used from one thread at
// a time, as the header says; the core only asks Send of its entropy so
// that a std driver may move it between threads.
unsafe impl Send for PlatformRandom {}

impl Entropy for PlatformRandom {
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), EntropyFailed> {
        if dest.is_empty() {
            return Ok(());
        }
        // SAFETY: `dest` is writable for its length; the callback fills
        // exactly `len` bytes, as its type says.
        let filled = unsafe { (self.random)(self.ctx, dest.as_mut_ptr(), dest.len()) };
        if filled { Ok(()) } else { Err(EntropyFailed) }
    }
}
