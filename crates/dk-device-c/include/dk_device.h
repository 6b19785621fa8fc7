/*
 * dk_device.h: dk's device side for C firmware (libdk_device.a).
 *
 * Written by cbindgen from crates/dk-device-c: do not edit; run
 * `DK_BLESS=1 cargo test -p dk-device-c header` after changing the crate.
 */

#ifndef DK_DEVICE_H
#define DK_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The length of the credentials blob a device keeps
// (`dk_output_kind::DK_OUTPUT_STORE`) and is given back at creation.
#define DK_CREDENTIALS_BYTES 66

// The longest buffer any function takes (a manifest, a message, a
// result): longer is `DK_ERR_TOO_LONG`.
#define DK_MAX_INPUT 1048576

// The smallest `max_frame_bytes` an option may set.
#define DK_MIN_FRAME_BYTES 1024

// The most calls at once an option may set.
#define DK_MAX_IN_FLIGHT 4096

// The most call ids an option may have remembered.
#define DK_MAX_REMEMBERED_CALLS 65536

// The bytes of the library's reserve: its own memory (in its data, not
// the heap) that answers a small allocation the platform refused, so that
// the call it happened in can end its connection and return
// `DK_ERR_NO_MEMORY` instead of aborting.
#define DK_RESERVE_BYTES 8192

// What a function made of its arguments. `DK_OK` is 0; every error is
// negative, and `dk_status_text` names it.
enum dk_status
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  // Done.
  DK_OK = 0,
  // A pointer that must not be NULL is, or NULL came with a length.
  DK_ERR_NULL = -1,
  // A length over `DK_MAX_INPUT`, or not the length the value has.
  DK_ERR_TOO_LONG = -2,
  // Text that is not UTF-8.
  DK_ERR_UTF8 = -3,
  // A result or an event that is not JSON.
  DK_ERR_JSON = -4,
  // The manifest is not valid (the error text says why).
  DK_ERR_MANIFEST = -5,
  // The stored credentials cannot be read back.
  DK_ERR_CREDENTIALS = -6,
  // A platform callback is missing, or other allocation callbacks are
  // registered already.
  DK_ERR_PLATFORM = -7,
  // The platform gave no random bytes.
  DK_ERR_ENTROPY = -8,
  // No call with that id is running (answered already, or its
  // connection ended: the vessel failed it).
  DK_ERR_NO_SUCH_CALL = -9,
  // No connection is serving: nothing can be sent now.
  DK_ERR_NOT_CONNECTED = -10,
  // The manifest declares no such capability.
  DK_ERR_UNKNOWN_CAPABILITY = -11,
  // The vessel would refuse the frame (too large, nested too deep).
  DK_ERR_REFUSED = -12,
  // Not now: a poll from inside a handler, a reply given twice.
  DK_ERR_BUSY = -13,
  // The platform's allocator had no memory: the call did not happen, or
  // the connection it belonged to was ended (a `DK_OUTPUT_ENDED` with
  // `DK_END_RETRY` comes out of the next poll) and what it held freed.
  // The device is still usable: connect again after a backoff.
  DK_ERR_NO_MEMORY = -14,
  // An option out of its range (`dk_options` says each one's).
  DK_ERR_OPTIONS = -15,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum dk_status dk_status;
#else
typedef int32_t dk_status;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

// Where the connection stands.
enum dk_state
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  // No connection: `dk_device_connect`
  // starts one.
  DK_STATE_IDLE = 0,
  // The dk/2 handshake runs.
  DK_STATE_HANDSHAKING = 1,
  // `device:hello` was sent: the pairing runs.
  DK_STATE_PAIRING = 2,
  // Paired or authenticated: calls are served.
  DK_STATE_SERVING = 3,
  // The device closed and waits for the vessel's close.
  DK_STATE_CLOSING = 4,
  // The connection ended.
  DK_STATE_ENDED = 5,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum dk_state dk_state;
#else
typedef int32_t dk_state;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

// What `dk_device_poll` asks of the platform.
enum dk_output_kind
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  // Nothing (the poll returned false).
  DK_OUTPUT_NONE = 0,
  // Send `data`/`len` as a WebSocket text message.
  DK_OUTPUT_SEND_TEXT = 1,
  // Send `data`/`len` as a WebSocket binary message.
  DK_OUTPUT_SEND_BINARY = 2,
  // Close the WebSocket with `close_code` (0: none) and the reason in
  // `data`/`len`; send nothing after it.
  DK_OUTPUT_SEND_CLOSE = 3,
  // The connection is open: the handshake is done and the vessel's key
  // checked.
  DK_OUTPUT_CONNECTED = 4,
  // Show the person the 6-digit pairing code in `data` (NUL-terminated).
  DK_OUTPUT_SHOW_CODE = 5,
  // Keep the `DK_CREDENTIALS_BYTES` bytes in `data` (a secret: the
  // device's key), replacing what was kept, and pass them to the next
  // `dk_device_new`; when they cannot be kept,
  // call `dk_device_storage_failed`.
  DK_OUTPUT_STORE = 6,
  // Run the call in `call` (no handler is registered for its
  // capability) and answer it with
  // `dk_device_answer`.
  DK_OUTPUT_INVOKE = 7,
  // Something to log (`data`, NUL-terminated), when no log callback is
  // registered.
  DK_OUTPUT_NOTICE = 8,
  // The connection ended (`end` says how, `data` why): close the socket
  // now if it is still open (no `DK_OUTPUT_SEND_CLOSE` need come before
  // this: a handshake that timed out, a connection ended for want of
  // memory, end without one), and connect again after a backoff when
  // `end` is `DK_END_RETRY`.
  DK_OUTPUT_ENDED = 9,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum dk_output_kind dk_output_kind;
#else
typedef int32_t dk_output_kind;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

// How a connection ended.
enum dk_end
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  // Not an end (the output is of another kind).
  DK_END_NONE = 0,
  // Connecting again makes sense, after a backoff.
  DK_END_RETRY = 1,
  // The device must not connect again on its own: the person must act
  // (pair again, check the vessel's key).
  DK_END_STOP = 2,
  // `dk_device_shutdown` or `dk_device_shutdown_within` asked for it.
  DK_END_SHUTDOWN = 3,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum dk_end dk_end;
#else
typedef int32_t dk_end;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

// A dk device: its manifest, credentials, calls and the connection now
// open. Opaque: made by `dk_device_new`, freed by `dk_device_free`,
// used from one thread at a time.
typedef struct dk_device dk_device;

// A handler's answer to one call, given with
// `dk_reply_ok` or
// `dk_reply_error` during the handler, which send it at once.
typedef struct dk_reply dk_reply;

// Fills `len` bytes at `buf` with unpredictable random bytes (a hardware
// generator, the operating system's); returns false when it cannot.
typedef bool (*dk_random_fn)(void *ctx, uint8_t *buf, size_t len);

// Allocates `size` bytes aligned to `align` (a power of two), or returns
// NULL when there is no memory. `ctx` is the platform's.
typedef void *(*dk_alloc_fn)(size_t size, size_t align, void *ctx);

// Frees what the allocation callback returned, with the same `size` and
// `align`.
typedef void (*dk_free_fn)(void *ptr, size_t size, size_t align, void *ctx);

// Receives one line for the device's log: `len` bytes of UTF-8 at `text`,
// NUL-terminated, valid only during the call.
typedef void (*dk_log_fn)(void *ctx, const char *text, size_t len);

// The platform's callbacks, each given `ctx` back.
typedef struct {
  // Handed back to every callback.
  void *ctx;
  // Random bytes (required).
  dk_random_fn random;
  // Memory (required, with `free`): registered once for the whole
  // library by `dk_platform_init` or the first device made.
  dk_alloc_fn alloc;
  // Frees memory from `alloc` (required).
  dk_free_fn free;
  // The device's log (optional, may be NULL): notices (frames set aside,
  // a close not announced in the channel) go here instead of out of
  // `dk_device_poll`.
  dk_log_fn log;
} dk_platform;

// How a device runs; zero in a field means its default, and a NULL
// options pointer means every default. A field out of its range is
// `DK_ERR_OPTIONS`.
typedef struct {
  // The credentials the device kept (`DK_CREDENTIALS_BYTES` bytes), or
  // NULL on its first run: a key is made at the first connection and
  // given out to keep.
  const uint8_t *credentials;
  // Their length: `DK_CREDENTIALS_BYTES`, or 0 with NULL (credentials
  // of another length, 0 included, are `DK_ERR_CREDENTIALS`).
  size_t credentials_len;
  // The largest frame taken from the vessel, in bytes
  // (`DK_MIN_FRAME_BYTES` to `DK_MAX_INPUT`; default `DK_MAX_INPUT`).
  // A device short of memory sets it to what its calls need: a call
  // takes at most its frame and 8 KiB more.
  size_t max_frame_bytes;
  // How many calls may run at once (1 to `DK_MAX_IN_FLIGHT`; default
  // 64).
  size_t max_in_flight;
  // How many call ids are remembered so that a repeat never runs, 8
  // bytes each (1 to `DK_MAX_REMEMBERED_CALLS`; default 1024).
  size_t remember_calls;
  // How long the handshake may take, in milliseconds (default 10000).
  uint32_t handshake_timeout_ms;
  // How long to wait for the vessel's close after the device's, in
  // milliseconds (default 1000).
  uint32_t close_timeout_ms;
} dk_options;

// A call to run: UTF-8 text, each NUL-terminated (the lengths leave the
// NUL out, and none holds a NUL before its end: a call whose id has one is
// answered with an error instead of run).
typedef struct {
  // The call's id, to answer with.
  const char *call_id;
  // Its length.
  size_t call_id_len;
  // The capability called (one the manifest declares).
  const char *capability;
  // Its length.
  size_t capability_len;
  // The input, a JSON object the vessel checked against the params.
  const char *input;
  // Its length.
  size_t input_len;
} dk_call;

// Runs a call of the capability it was registered for: `call` names it
// and carries its input (valid only during the handler). The handler
// answers through `reply` (`dk_reply_ok`,
// `dk_reply_error`) before it returns, or later
// with `dk_device_answer` and the call's id.
// It may emit events and answer calls; a device it frees is freed once it
// returns (the poll then returns false).
typedef void (*dk_handler_fn)(void *ctx, const dk_call *call, dk_reply *reply);

// One thing for the platform to do, from
// `dk_device_poll`. Its pointers stay valid
// until the next poll or `dk_device_free`.
typedef struct {
  // What to do.
  dk_output_kind kind;
  // The bytes of it (see each kind); NUL-terminated when text.
  const uint8_t *data;
  // Their length (without the NUL).
  size_t len;
  // `DK_OUTPUT_SEND_CLOSE`: the close code, 0 for none.
  uint16_t close_code;
  // `DK_OUTPUT_ENDED`: how.
  dk_end end;
  // `DK_OUTPUT_INVOKE`: the call.
  dk_call call;
} dk_output;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Makes a device from its manifest's JSON (`manifest_len` bytes of UTF-8
// at `manifest_json`), the platform's callbacks and `options` (NULL: every
// default, and no credentials kept yet), into `*device`. The platform's
// allocation callbacks are registered if they were not.
//
// Returns `DK_OK`, or why not: `DK_ERR_NULL` (no platform, no `device`,
// NULL with a length), `DK_ERR_PLATFORM` (a callback missing, other
// allocation callbacks registered), `DK_ERR_OPTIONS`,
// `DK_ERR_CREDENTIALS`, `DK_ERR_TOO_LONG`, `DK_ERR_UTF8`,
// `DK_ERR_MANIFEST`, `DK_ERR_ENTROPY`, `DK_ERR_NO_MEMORY`, with `*device`
// NULL and the reason in `error` (`error_capacity` bytes, NUL-terminated,
// cut to fit; `error` may be NULL). Nothing is allocated before the
// platform's allocator is registered, and a refused allocation after is
// `DK_ERR_NO_MEMORY`, with everything made so far freed.
//
// # Safety
//
// `platform` and `options` are NULL or readable; `manifest_json` is
// readable for `manifest_len` bytes, the options' credentials for their
// length; `device` is NULL or writable; `error` is NULL or writable for
// `error_capacity` bytes.
dk_status dk_device_new(const dk_platform *platform,
                        const char *manifest_json,
                        size_t manifest_len,
                        const dk_options *options,
                        dk_device **device,
                        char *error,
                        size_t error_capacity);

// Frees a device and everything it holds (its key is wiped). NULL is
// ignored. From inside a handler, the device is freed once the handler
// returns and the poll that ran it returns false.
//
// # Safety
//
// `device` is NULL or from `dk_device_new`, not freed yet; nothing it
// gave out is used after.
void dk_device_free(dk_device *device);

// Registers `handler` (with its `ctx`) for calls of `capability` (`len`
// bytes of UTF-8), replacing any; a NULL handler removes it. Calls of a
// capability without a handler come out of `dk_device_poll` as
// `DK_OUTPUT_INVOKE`. Asks for no memory.
//
// # Safety
//
// `device` is NULL or a live device; `capability` is readable for `len`
// bytes; the handler behaves as `dk_handler_fn` says.
dk_status dk_device_on(dk_device *device,
                       const char *capability,
                       size_t len,
                       dk_handler_fn handler,
                       void *ctx);

// Answers the running call `call_id` (`id_len` bytes): with `ok`, `text`
// is the result as JSON (`DK_ERR_JSON` when it is not, and the call still
// runs); without, it is the error's text. `DK_ERR_NO_SUCH_CALL` when no
// such call runs (answered already, or its connection ended);
// `DK_ERR_NO_MEMORY` when the platform has no memory for the answer's
// frame (the call still runs: answer it again, or with a shorter text).
//
// # Safety
//
// `device` is NULL or a live device; `call_id` and `text` are readable
// for their lengths.
dk_status dk_device_answer(dk_device *device,
                           const char *call_id,
                           size_t id_len,
                           bool ok,
                           const char *text,
                           size_t len);

// The handler's result, as JSON (`len` bytes of UTF-8 at `json`), sent at
// once: `DK_ERR_JSON` when it is not JSON, `DK_ERR_BUSY` when the call
// was answered already, `DK_ERR_NO_MEMORY` as `dk_device_answer` says.
//
// # Safety
//
// `reply` is NULL or the handler's; `json` is readable for `len` bytes.
dk_status dk_reply_ok(dk_reply *reply, const char *json_ptr, size_t len);

// The handler's error, as text (`len` bytes of UTF-8 at `error`), which
// the agent reads after `device error: `, sent at once. `DK_ERR_BUSY`
// when the call was answered already.
//
// # Safety
//
// `reply` is NULL or the handler's; `error` is readable for `len` bytes.
dk_status dk_reply_error(dk_reply *reply, const char *error, size_t len);

// Sends `device:event {capability, data}` for a declared capability or a
// declared event (the manifest's `events`, `capability_len` bytes), with
// `data` as JSON (`len` bytes), when a connection is serving; the message
// to send then comes out of `dk_device_poll`. A declared event's data
// must keep its params (`DK_ERR_REFUSED` otherwise, nothing sent); an
// unknown name is `DK_ERR_UNKNOWN_CAPABILITY`.
// `DK_ERR_NO_MEMORY` when the platform has no memory for the event's
// frame.
//
// # Safety
//
// `device` is NULL or a live device; `capability` and `data` are readable
// for their lengths.
dk_status dk_device_emit(dk_device *device,
                         const char *capability,
                         size_t capability_len,
                         const char *data,
                         size_t len);

// Starts a connection on a WebSocket just opened to the vessel (with the
// `dk.2` subprotocol): the first handshake message is then polled. A
// connection still open is forgotten, its calls abandoned.
//
// # Safety
//
// `device` is NULL or a live device.
dk_status dk_device_connect(dk_device *device, uint64_t now_ms);

// Feeds a binary WebSocket message received (dk/2's handshake messages
// and records), `len` bytes at `data`.
//
// # Safety
//
// `device` is NULL or a live device; `data` is readable for `len` bytes.
dk_status dk_device_receive_binary(dk_device *device,
                                   uint64_t now_ms,
                                   const uint8_t *data,
                                   size_t len);

// Feeds a text WebSocket message received, `len` bytes of UTF-8 at
// `text` (on dk/2 a text message breaks the channel: everything travels
// in binary records).
//
// # Safety
//
// `device` is NULL or a live device; `data` is readable for `len` bytes.
dk_status dk_device_receive_text(dk_device *device, uint64_t now_ms, const char *data, size_t len);

// Feeds the vessel's close: its code (0 when it gave none) and reason
// (`len` bytes of UTF-8; ignored without a code).
//
// # Safety
//
// `device` is NULL or a live device; `reason` is readable for `len` bytes.
dk_status dk_device_receive_close(dk_device *device,
                                  uint64_t now_ms,
                                  uint16_t code,
                                  const char *reason,
                                  size_t len);

// Says the connection dropped, or could not be written to, without a
// close.
//
// # Safety
//
// `device` is NULL or a live device.
dk_status dk_device_lost(dk_device *device, uint64_t now_ms);

// When `dk_device_handle_timeout` is due, in the platform's
// milliseconds: true and `*at_ms` set when a timer runs, false when none
// does (or `device` or `at_ms` is NULL).
//
// # Safety
//
// `device` is NULL or a live device; `at_ms` is NULL or writable.
bool dk_device_next_timeout(dk_device *device, uint64_t *at_ms);

// Handles the timer once `now_ms` is past `dk_device_next_timeout`'s
// instant; earlier, nothing happens.
//
// # Safety
//
// `device` is NULL or a live device.
dk_status dk_device_handle_timeout(dk_device *device, uint64_t now_ms);

// Ends the connection on the device's side at once: a close 1000 to
// send, then the vessel's close (or the close timeout) ends it. Calls
// still running are dropped (the vessel fails them); to let them finish,
// `dk_device_shutdown_within`.
//
// # Safety
//
// `device` is NULL or a live device.
dk_status dk_device_shutdown(dk_device *device, uint64_t now_ms);

// Ends the connection on the device's side, giving the calls that run
// `grace_ms` to be answered (`dk_device_answer`): meanwhile a new call is
// refused ("device is shutting down") and never reaches a handler, and
// the close 1000 comes once the last is answered or when the grace ends,
// whichever is first. `dk_device_next_timeout` says when to call
// `dk_device_handle_timeout` (at once, after the last answer). With no
// call running, or a grace of 0, it is `dk_device_shutdown`. Calling it
// again can only bring the close nearer.
//
// # Safety
//
// `device` is NULL or a live device.
dk_status dk_device_shutdown_within(dk_device *device, uint64_t now_ms, uint64_t grace_ms);

// Says the credentials of `DK_OUTPUT_STORE` could not be kept: the
// connection is closed and the device stops, rather than run with a key
// it would lose.
//
// # Safety
//
// `device` is NULL or a live device.
dk_status dk_device_storage_failed(dk_device *device, uint64_t now_ms);

// Where the connection stands (`DK_STATE_IDLE` for NULL).
//
// # Safety
//
// `device` is NULL or a live device.
dk_state dk_device_state(dk_device *device);

// Whether the device stops connecting after the vessel's upgrade answered
// HTTP `status` instead of a WebSocket (the device core's rule,
// `reconnect::believe`). A device paired over dk/2 hears its vessel's
// refusals inside the channel, so a 403 before it, which anyone on the
// path can forge, does not stop it: false, connect again after the
// backoff. A device not paired stops on a 403 (the vessel does not take
// it there; the person must act). Any other status, a busy 503 included,
// never stops a device; nor does a NULL device. Asks for no memory.
//
// # Safety
//
// `device` is NULL or a live device.
bool dk_device_stops_on_http_status(dk_device *device, uint16_t status);

// The next thing to do, in order, into `*out`: true when there is one,
// false once all is done (then `out->kind` is `DK_OUTPUT_NONE`). Calls of
// capabilities with a handler run inside the poll and are answered as
// their handler says; notices go to the log callback when there is one.
// `out`'s pointers stay valid until the next poll or free. False, too,
// for a NULL argument or a poll from inside a handler.
//
// # Safety
//
// `device` is NULL or a live device; `out` is NULL or writable.
bool dk_device_poll(dk_device *device, dk_output *out);

// What a status means, as static NUL-terminated text ("unknown status"
// for a value that is none).
const char *dk_status_text(int32_t status);

// Registers the platform's allocation callbacks for the whole library,
// once, before anything else (the first `dk_device_new`
// does it too). Until then every allocation fails. The callbacks are
// given the `ctx` of that first registration, always. Registering the
// same callbacks again is `DK_OK` (whatever the `ctx`); others are
// refused with
// `DK_ERR_PLATFORM` (memory already given out must go back where it came
// from), as is a platform without both callbacks.
//
// # Safety
//
// `platform` is NULL or points to a readable `dk_platform`; its callbacks
// behave as their types say for as long as the library is used.
dk_status dk_platform_init(const dk_platform *platform);

// The wait before the next connection, in milliseconds: `random` (from
// the platform's random bytes) spread uniformly over zero to
// `initial_ms * 2^attempt`, that ceiling capped at `max_ms`, as every dk
// device waits ("full jitter", so a fleet refused at once does not come
// back at once). `attempt` counts the failed connections since the last
// one that held.
uint32_t dk_next_backoff_ms(uint32_t initial_ms,
                            uint32_t max_ms,
                            uint32_t attempt,
                            uint64_t random);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* DK_DEVICE_H */
