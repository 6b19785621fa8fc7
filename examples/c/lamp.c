/*
 * lamp.c: a desk lamp written in C on libdk_device.a and libwebsockets.
 *
 *   lamp ws://HOST:PORT/device CREDENTIALS_FILE [--stats FILE] [--handshakes N]
 *        [--handshake-timeout-ms MS]
 *
 * It pairs with the vessel (printing `pairing code: NNNNNN` for the person
 * to compare), keeps its credentials in CREDENTIALS_FILE, reconnects by key
 * when restarted, and answers `set_light` and `read_light`, printing
 * `light: on|off BRIGHTNESS` for each change. Everything but the lamp (the
 * platform, the connection, the backoff, --stats and --handshakes, the
 * signals and the exit codes) is the runner's, dk_lws.c, which every C
 * example shares; dk_lws.h says what it does. SIGTERM or SIGINT closes the
 * connection at once and frees everything.
 *
 * Exit codes: 0 after a signal, 2 for bad arguments or setup, 3 when the
 * device must stop until the person acts (pairing refused, another
 * vessel's key).
 *
 * Build: cargo xtask firmware (it prints the lamp's path), or
 *   gcc -Os -I crates/dk-device-c/include examples/c/lamp.c examples/c/dk_lws.c \
 *       target/firmware/c/libdk_device.a $(pkg-config --libs libwebsockets)
 */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_device.h"
#include "dk_lws.h"

/* fixtures/manifests/valid/desk-lamp.json */
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

/* ---- the lamp ---- */

struct lamp_state {
    bool on;
    int brightness;
};

static struct lamp_state light;

static void reply_state(dk_reply *reply) {
    char json[64];
    int n = snprintf(json, sizeof json, "{\"on\":%s,\"brightness\":%d}", light.on ? "true" : "false",
                     light.brightness);
    dk_reply_ok(reply, json, (size_t)n);
}

static void set_light(void *ctx, const dk_call *call, dk_reply *reply) {
    (void)ctx;
    const char *on = dk_lws_json_field(call->input, call->input_len, "on");
    const char *brightness = dk_lws_json_field(call->input, call->input_len, "brightness");
    if (!on) {
        dk_reply_error(reply, "on is required", 14);
        return;
    }
    light.on = strncmp(on, "true", 4) == 0;
    if (brightness) {
        int level = atoi(brightness);
        if (level < 0 || level > 100) {
            dk_reply_error(reply, "brightness is 0-100", 19);
            return;
        }
        light.brightness = level;
    }
    printf("light: %s %d\n", light.on ? "on" : "off", light.brightness);
    fflush(stdout);
    reply_state(reply);
}

static void read_light(void *ctx, const dk_call *call, dk_reply *reply) {
    (void)ctx;
    (void)call;
    reply_state(reply);
}

static void lamp_handlers(dk_device *device) {
    dk_lws_check(dk_device_on(device, "set_light", 9, set_light, NULL), "set_light");
    dk_lws_check(dk_device_on(device, "read_light", 10, read_light, NULL), "read_light");
}

int main(int argc, char **argv) {
    static const struct dk_lws_device lamp = {
        .name = "lamp",
        .manifest = MANIFEST,
        /* A lamp's calls are small: a 16 KiB frame is plenty. */
        .max_frame_bytes = 16384,
        .max_in_flight = 4,
        .remember_calls = 64,
        .handlers = lamp_handlers,
    };
    return dk_lws_run(&lamp, argc, argv);
}
