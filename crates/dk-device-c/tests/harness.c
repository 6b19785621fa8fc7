/*
 * harness.c: a lamp on libdk_device.a (the firmware build) driven line by
 * line from its standard input, for crates/dk-device-c/tests/firmware.rs,
 * which plays the vessel. Its allocator refuses memory as it is told.
 *
 * Commands (one a line; BYTES in hex), each answered with lines ending in
 * `done`:
 *
 *   early                  dk_device_new before any allocator is registered,
 *                          with no platform and with half a platform:
 *                          `status N` each (run it first)
 *   plan plenty|once|from|cap N
 *                          from now, refuse the N-th allocation, every one
 *                          from the N-th, or any over N bytes held
 *   new [BYTES]            dk_device_new with the credentials BYTES
 *   connect | lost         dk_device_connect, dk_device_lost
 *   recv BYTES             dk_device_receive_binary
 *   free                   dk_device_free
 *   stats                  `asked N refused N live N peak N`
 *   peak                   starts the peak again from what is held
 *
 * After every device call: `status N`, then each output `out KIND END
 * CODE BYTES`, and the statuses of the handler's replies as `reply N`.
 */

#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_device.h"

static const char MANIFEST[] =
    "{\"id\":\"desk-lamp\",\"name\":\"Desk lamp\",\"kind\":\"lamp\",\"version\":\"0.1.0\","
    "\"capabilities\":["
    "{\"name\":\"read_light\",\"kind\":\"sensor\","
    "\"description\":\"Read whether the lamp is on and its brightness (0-100).\"},"
    "{\"name\":\"set_light\",\"kind\":\"actuator\","
    "\"description\":\"Turn the lamp on or off and set its brightness.\","
    "\"params\":{\"on\":{\"type\":\"boolean\",\"required\":true,\"description\":\"true for on\"},"
    "\"brightness\":{\"type\":\"number\",\"description\":\"0-100\"}}},"
    "{\"name\":\"strobe\",\"kind\":\"actuator\","
    "\"description\":\"Flash the lamp rapidly. Asks the person every time.\",\"confirm\":true}]}";

/* ---- memory, refused as planned ---- */

enum plan { PLENTY, ONCE, FROM, CAP };
static enum plan plan;
static size_t plan_n, asked, refused, live, peak;

static void *plan_alloc(size_t size, size_t align, void *ctx) {
    (void)ctx;
    asked++;
    bool refuse = (plan == ONCE && asked == plan_n) || (plan == FROM && asked >= plan_n) ||
                  (plan == CAP && live + size > plan_n);
    if (refuse) {
        refused++;
        return NULL;
    }
    void *block = NULL;
    if (posix_memalign(&block, align < sizeof(void *) ? sizeof(void *) : align, size) != 0)
        return NULL;
    live += size;
    if (live > peak) peak = live;
    return block;
}

static void plan_free(void *block, size_t size, size_t align, void *ctx) {
    (void)align;
    (void)ctx;
    live -= size;
    free(block);
}

/* Random bytes from a counter: the vessel's side needs none of them. */
static bool counter(void *ctx, uint8_t *buf, size_t len) {
    (void)ctx;
    static uint8_t next = 1;
    for (size_t i = 0; i < len; i++) buf[i] = next += 7;
    return true;
}

static dk_platform platform = {NULL, counter, plan_alloc, plan_free, NULL};

/* ---- the lamp ---- */

static dk_device *device;

static void set_light(void *ctx, const dk_call *call, dk_reply *reply) {
    (void)ctx;
    (void)call;
    static const char state[] = "{\"on\":true,\"brightness\":37}";
    printf("reply %d\n", dk_reply_ok(reply, state, sizeof state - 1));
}

static void hex_out(const uint8_t *bytes, size_t len) {
    if (!len) putchar('-');
    for (size_t i = 0; i < len; i++) printf("%02x", bytes[i]);
}

static size_t hex_in(const char *text, uint8_t *out) {
    size_t n = 0;
    unsigned byte;
    while (sscanf(text + 2 * n, "%2x", &byte) == 1) out[n++] = (uint8_t)byte;
    return n;
}

static void drained(dk_status status) {
    printf("status %d\n", status);
    dk_output out;
    while (device && dk_device_poll(device, &out)) {
        printf("out %d %d %u ", out.kind, out.end, out.close_code);
        hex_out(out.data, out.data ? out.len : 0);
        putchar('\n');
    }
}

int main(void) {
    char *line = NULL;
    size_t cap = 0;
    static uint8_t bytes[1 << 20];
    uint64_t now = 1;
    while (getline(&line, &cap, stdin) > 0) {
        char word[16] = "";
        char arg[32] = "";
        sscanf(line, "%15s %31s", word, arg);
        const char *rest = strchr(line, ' ');
        rest = rest ? rest + 1 : "";
        now++;
        if (strcmp(word, "early") == 0) {
            char error[128];
            dk_device *made = (dk_device *)&made;
            dk_status status =
                dk_device_new(NULL, MANIFEST, strlen(MANIFEST), NULL, &made, error, sizeof error);
            printf("status %d %s %s\n", status, made ? "device" : "none", error);
            dk_platform half = platform;
            half.free = NULL;
            made = (dk_device *)&made;
            status =
                dk_device_new(&half, MANIFEST, strlen(MANIFEST), NULL, &made, error, sizeof error);
            printf("status %d %s %s\n", status, made ? "device" : "none", error);
            printf("status %d\n", dk_platform_init(&half));
        } else if (strcmp(word, "plan") == 0) {
            plan = strcmp(arg, "once") == 0   ? ONCE
                   : strcmp(arg, "from") == 0 ? FROM
                   : strcmp(arg, "cap") == 0  ? CAP
                                              : PLENTY;
            plan_n = strtoull(strchr(rest, ' ') ? strchr(rest, ' ') + 1 : "0", NULL, 10);
            asked = refused = 0;
        } else if (strcmp(word, "new") == 0) {
            size_t n = hex_in(rest, bytes);
            dk_options options;
            memset(&options, 0, sizeof options);
            options.credentials = n ? bytes : NULL;
            options.credentials_len = n;
            char error[128] = "";
            dk_status status = dk_device_new(&platform, MANIFEST, strlen(MANIFEST), &options,
                                             &device, error, sizeof error);
            if (device) dk_device_on(device, "set_light", 9, set_light, NULL);
            printf("status %d %s\n", status, error);
        } else if (strcmp(word, "connect") == 0) {
            drained(dk_device_connect(device, now));
        } else if (strcmp(word, "lost") == 0) {
            drained(dk_device_lost(device, now));
        } else if (strcmp(word, "recv") == 0) {
            size_t n = hex_in(rest, bytes);
            drained(dk_device_receive_binary(device, now, bytes, n));
        } else if (strcmp(word, "free") == 0) {
            dk_device_free(device);
            device = NULL;
        } else if (strcmp(word, "stats") == 0) {
            printf("asked %zu refused %zu live %zu peak %zu\n", asked, refused, live, peak);
        } else if (strcmp(word, "peak") == 0) {
            peak = live;
        }
        printf("done\n");
        fflush(stdout);
    }
    free(line);
    return 0;
}
