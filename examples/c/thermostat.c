/*
 * thermostat.c: a hall thermostat written in C on libdk_device.a and
 * libwebsockets, the C twin of dk-device's `Thermostat::declaring` and
 * examples/python/thermostat.py.
 *
 *   thermostat ws://HOST:PORT/device CREDENTIALS_FILE [--stats FILE]
 *              [--handshakes N] [--handshake-timeout-ms MS]
 *
 * Its manifest declares what an 8DK manifest cannot say (the dk manifest
 * extension): `set_target`'s `celsius` from 5 to 30 °C and its `mode` one
 * of heat, cool and auto, which the vessel enforces before the person is
 * asked and the device core before a handler runs, so `set_target` below
 * never sees 35 °C; and the event `temperature_changed`, which the person
 * grants as a capability. The hall starts at 20 °C, target 20, mode auto;
 * `read_temperature` and `set_target` answer `{current, target, mode}`,
 * and each second, while connected, the temperature moves 0.5 °C toward
 * the target and, when it moved, goes out as `temperature_changed`. It
 * prints `target: CELSIUS MODE` for each `set_target` it runs and
 * `temperature: CELSIUS` for each event sent.
 *
 * Everything else (pairing, the credentials file, reconnecting, --stats,
 * exit codes) is the runner's, dk_lws.c (see dk_lws.h). SIGTERM or SIGINT
 * gives calls still running 5 s to be answered (dk_device_shutdown_within),
 * then closes the connection and frees everything.
 *
 * Build: cargo xtask firmware (it prints the thermostat's path), or
 *   gcc -Os -I crates/dk-device-c/include examples/c/thermostat.c examples/c/dk_lws.c \
 *       target/firmware/c/libdk_device.a $(pkg-config --libs libwebsockets)
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_device.h"
#include "dk_lws.h"

/* fixtures/manifests/dk/hall-thermostat.json */
static const char MANIFEST[] =
    "{\"dk\":1,\"id\":\"hall-thermostat\",\"name\":\"Hall thermostat\",\"kind\":\"thermostat\","
    "\"version\":\"3.0.0\",\"capabilities\":["
    "{\"name\":\"read_temperature\",\"kind\":\"sensor\","
    "\"description\":\"Current and target temperature in degrees Celsius.\"},"
    "{\"name\":\"set_target\",\"kind\":\"actuator\",\"title\":\"Target temperature\","
    "\"description\":\"Set the target temperature.\",\"params\":{"
    "\"celsius\":{\"type\":\"number\",\"description\":\"The temperature to reach\","
    "\"required\":true,\"minimum\":5,\"maximum\":30,\"unit\":\"°C\"},"
    "\"mode\":{\"type\":\"string\",\"description\":\"How to reach it\","
    "\"enum\":[\"heat\",\"cool\",\"auto\"]}}}],"
    "\"events\":[{\"name\":\"temperature_changed\","
    "\"description\":\"The hall's temperature moved toward the target.\",\"params\":{"
    "\"current\":{\"type\":\"number\",\"required\":true,\"minimum\":-40,\"maximum\":60,"
    "\"unit\":\"°C\"},"
    "\"target\":{\"type\":\"number\",\"required\":true,\"minimum\":5,\"maximum\":30,"
    "\"unit\":\"°C\"},"
    "\"mode\":{\"type\":\"string\",\"required\":true,\"enum\":[\"heat\",\"cool\",\"auto\"]}}}]}";

/* How far the temperature moves toward the target each tick, in °C. */
#define DRIFT_PER_TICK 0.5

/* ---- the hall ---- */

static struct {
    double current, target;
    char mode[8];
} hall = {20.0, 20.0, "auto"};

/* The hall as `{current, target, mode}`, into `json`: its length. */
static int reading(char *json, size_t size) {
    return snprintf(json, size, "{\"current\":%.10g,\"target\":%.10g,\"mode\":\"%s\"}",
                    hall.current, hall.target, hall.mode);
}

static void reply_reading(dk_reply *reply) {
    char json[128];
    int n = reading(json, sizeof json);
    dk_lws_check(dk_reply_ok(reply, json, (size_t)n), "reply");
}

static void read_temperature(void *ctx, const dk_call *call, dk_reply *reply) {
    (void)ctx;
    (void)call;
    reply_reading(reply);
}

/* The input's bounds were checked before this runs (5 <= celsius <= 30,
   mode one of heat, cool, auto): by the vessel, and again by the device
   core, in case the vessel does not know the dk extension. */
static void set_target(void *ctx, const dk_call *call, dk_reply *reply) {
    (void)ctx;
    const char *celsius = dk_lws_json_field(call->input, call->input_len, "celsius");
    const char *mode = dk_lws_json_field(call->input, call->input_len, "mode");
    if (!celsius) {
        dk_reply_error(reply, "celsius is required", 19);
        return;
    }
    hall.target = strtod(celsius, NULL);
    if (mode && *mode == '"') {
        size_t len = strcspn(mode + 1, "\"");
        if (len < sizeof hall.mode) {
            memcpy(hall.mode, mode + 1, len);
            hall.mode[len] = '\0';
        }
    }
    printf("target: %.10g %s\n", hall.target, hall.mode);
    fflush(stdout);
    reply_reading(reply);
}

static void thermostat_handlers(dk_device *device) {
    dk_lws_check(dk_device_on(device, "read_temperature", 16, read_temperature, NULL),
                 "read_temperature");
    dk_lws_check(dk_device_on(device, "set_target", 10, set_target, NULL), "set_target");
}

/* Each tick: the temperature moves toward the target, and when it moved
   the reading goes out as the declared event. */
static void drift(dk_device *device, uint64_t now_ms) {
    (void)now_ms;
    double gap = hall.target - hall.current;
    if (gap == 0.0) return;
    if (gap <= DRIFT_PER_TICK && gap >= -DRIFT_PER_TICK)
        hall.current = hall.target;
    else
        hall.current += gap > 0 ? DRIFT_PER_TICK : -DRIFT_PER_TICK;
    char json[128];
    int n = reading(json, sizeof json);
    dk_status sent = dk_device_emit(device, "temperature_changed", 19, json, (size_t)n);
    dk_lws_check(sent, "temperature_changed");
    if (sent == DK_OK) {
        printf("temperature: %.10g\n", hall.current);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    static const struct dk_lws_device thermostat = {
        .name = "thermostat",
        .manifest = MANIFEST,
        .max_frame_bytes = 16384,
        .max_in_flight = 4,
        .remember_calls = 64,
        .handlers = thermostat_handlers,
        .every = drift,
        .every_ms = 1000,
        .shutdown_grace_ms = 5000,
    };
    return dk_lws_run(&thermostat, argc, argv);
}
