/*
 * dk_lws.h: what every C example device on libdk_device.a and
 * libwebsockets shares, so that a device's own file holds only the
 * device: its manifest, its handlers and a main that calls dk_lws_run.
 *
 *   NAME ws://HOST:PORT/device CREDENTIALS_FILE [--stats FILE]
 *        [--handshakes N] [--handshake-timeout-ms MS]
 *
 * The runner (dk_lws.c) pairs with the vessel (printing `pairing code:
 * NNNNNN`), keeps the credentials in CREDENTIALS_FILE, reconnects by key
 * after the device core's backoff, counts the library's memory for
 * --stats, times --handshakes for the firmware bench, and leaves on
 * SIGTERM or SIGINT. Exit codes: 0 after a signal, 2 for bad arguments
 * or setup, 3 when the device must stop until the person acts.
 */

#ifndef DK_LWS_H
#define DK_LWS_H

#include <stddef.h>
#include <stdint.h>

#include "dk_device.h"

/* A device for dk_lws_run. */
struct dk_lws_device {
    /* Its name, first on each line it logs and in its usage. */
    const char *name;
    /* Its manifest's JSON, NUL-terminated. */
    const char *manifest;
    /* max_frame_bytes, max_in_flight and remember_calls of its
       dk_options (0: the library's default); the runner sets the
       credentials and the handshake's timeout. */
    size_t max_frame_bytes, max_in_flight, remember_calls;
    /* Registers its handlers with dk_device_on, once the device is made. */
    void (*handlers)(dk_device *device);
    /* Optional: called every every_ms while a connection serves, to emit
       events with dk_device_emit (the runner sends what it queued). */
    void (*every)(dk_device *device, uint64_t now_ms);
    uint32_t every_ms;
    /* How long calls still running on SIGTERM or SIGINT may take to be
       answered with dk_device_answer (dk_device_shutdown_within); 0
       closes at once (dk_device_shutdown). */
    uint64_t shutdown_grace_ms;
};

/* Runs `device` with the command line above until a signal or a stop:
   the exit code. */
int dk_lws_run(const struct dk_lws_device *device, int argc, char **argv);

/* Says what went wrong when a call into the library did not succeed,
   on standard error after the device's name. */
void dk_lws_check(dk_status status, const char *what);

/* The value of "key" in a flat JSON object of `len` bytes, as the text
   that follows its colon (NULL when it is not there). */
const char *dk_lws_json_field(const char *json, size_t len, const char *key);

#endif /* DK_LWS_H */
