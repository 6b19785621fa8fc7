/*
 * lamp.c: a desk lamp written in C on libdk_device.a and libwebsockets.
 *
 *   lamp ws://HOST:PORT/device CREDENTIALS_FILE [--stats FILE] [--handshakes N]
 *        [--handshake-timeout-ms MS]
 *
 * It pairs with the vessel (printing `pairing code: NNNNNN` for the person
 * to compare), keeps its credentials in CREDENTIALS_FILE, reconnects by key
 * when restarted, and answers `set_light` and `read_light`. A connection
 * that ends, or that cannot be made (the vessel is down or restarting), is
 * tried again after the device core's backoff (dk_next_backoff_ms): a
 * random delay up to 0.5 s, 1 s, 2 s, 4 s and then 8 s, back to 0.5 s once
 * connected. An HTTP 403 at the upgrade stops an unpaired lamp (exit 3) and
 * never a lamp paired over dk/2, to which anyone on the path could forge
 * one (dk_device_stops_on_http_status).
 * Random bytes come from getrandom(2); the library's memory from malloc,
 * counted, and with --stats the counts are written to FILE at exit: the
 * heap's peak while pairing, the heap while connected and idle, and what
 * each received frame allocated. With --handshakes N it connects N times
 * one after the other, closing each once its handshake is done, and adds
 * the median time from opening the socket to the handshake's end to the
 * stats. --handshake-timeout-ms sets how long a handshake may take
 * (default 10000). SIGTERM or SIGINT closes the connection and frees
 * everything.
 *
 * Time is kept by an lws timer (lws_sul_schedule) armed for the device's
 * next timeout and the next reconnection: libwebsockets ignores
 * lws_service()'s timeout argument since 3.2, so a loop that counts on it
 * to come back would sleep through the handshake's deadline.
 *
 * Exit codes: 0 after a signal, 2 for bad arguments or setup, 3 when the
 * device must stop until the person acts (pairing refused, another
 * vessel's key).
 *
 * Build: cargo xtask firmware (it prints the lamp's path), or
 *   gcc -Os -I crates/dk-device-c/include examples/c/lamp.c \
 *       target/firmware/c/libdk_device.a $(pkg-config --libs libwebsockets)
 */

#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <libwebsockets.h>

#include "dk_device.h"

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

/* ---- the library's memory, counted ---- */

/* heap_peak: the most ever held; frame_peak: the most held since it was
   last reset (one received frame). */
static size_t heap_now, heap_peak, frame_peak, allocations;

static void *count_alloc(size_t size, size_t align, void *ctx) {
    (void)ctx;
    void *block = NULL;
    if (align <= sizeof(max_align_t)) {
        block = malloc(size);
    } else if (posix_memalign(&block, align, size) != 0) {
        block = NULL;
    }
    if (block) {
        heap_now += size;
        allocations++;
        if (heap_now > heap_peak) heap_peak = heap_now;
        if (heap_now > frame_peak) frame_peak = heap_now;
    }
    return block;
}

static void count_free(void *block, size_t size, size_t align, void *ctx) {
    (void)align;
    (void)ctx;
    heap_now -= size;
    free(block);
}

static bool random_bytes(void *ctx, uint8_t *buf, size_t len) {
    (void)ctx;
    while (len > 0) {
        ssize_t got = getrandom(buf, len, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        buf += got;
        len -= (size_t)got;
    }
    return true;
}

static void log_line(void *ctx, const char *text, size_t len) {
    (void)ctx;
    fprintf(stderr, "lamp: %.*s\n", (int)len, text);
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the lamp ---- */

struct lamp_state {
    bool on;
    int brightness;
};

static struct lamp_state light;

/* The value of "key": in a flat JSON object, as text (or NULL). */
static const char *json_field(const char *json, size_t len, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *found = memmem(json, len, quoted, strlen(quoted));
    if (!found) return NULL;
    found += strlen(quoted);
    while (found < json + len && (*found == ' ' || *found == ':')) found++;
    return found < json + len ? found : NULL;
}

static void reply_state(dk_reply *reply) {
    char json[64];
    int n = snprintf(json, sizeof json, "{\"on\":%s,\"brightness\":%d}", light.on ? "true" : "false",
                     light.brightness);
    dk_reply_ok(reply, json, (size_t)n);
}

static void set_light(void *ctx, const dk_call *call, dk_reply *reply) {
    (void)ctx;
    const char *on = json_field(call->input, call->input_len, "on");
    const char *brightness = json_field(call->input, call->input_len, "brightness");
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

/* ---- the connection ---- */

struct message {
    struct message *next;
    dk_output_kind kind;
    uint16_t close_code;
    size_t len;
    unsigned char bytes[]; /* LWS_PRE bytes of room, then the message */
};

static struct {
    const char *credentials_path;
    const char *stats_path;
    struct lws_context *context;
    /* socket: a connection is being made or is open; wsi: it is open */
    bool socket;
    struct lws *wsi;
    dk_device *device;
    struct message *queue, *queue_tail;
    unsigned char *rx;
    size_t rx_len, rx_cap;
    bool rx_binary;
    /* ended: the device ended the connection; hangup: close the socket
       once what is queued is written */
    bool ended, hangup, stop, serving_seen;
    int exit_code;
    /* when to connect again (0: not planned), and how many tries have
       failed since the last connection */
    uint64_t reconnect_at;
    unsigned attempts;
    lws_sorted_usec_list_t timer;
    /* --handshakes: how many are left, when this one started, the times */
    unsigned handshakes, handshakes_done;
    uint64_t handshake_started, *handshake_us;
    /* the stats */
    size_t pairing_peak, idle_heap, frames, frame_alloc_max, frame_alloc_total, frame_count_max;
} lamp;

static volatile sig_atomic_t signalled;

static void on_signal(int signal) {
    (void)signal;
    signalled = 1;
}

static void enqueue(const dk_output *out) {
    struct message *m = malloc(sizeof *m + LWS_PRE + out->len + 1);
    if (!m) return;
    m->next = NULL;
    m->kind = out->kind;
    m->close_code = out->close_code;
    m->len = out->len;
    if (out->len) memcpy(m->bytes + LWS_PRE, out->data, out->len);
    if (lamp.queue_tail)
        lamp.queue_tail->next = m;
    else
        lamp.queue = m;
    lamp.queue_tail = m;
    if (lamp.wsi) lws_callback_on_writable(lamp.wsi);
}

static void drop_queue(void) {
    while (lamp.queue) {
        struct message *next = lamp.queue->next;
        free(lamp.queue);
        lamp.queue = next;
    }
    lamp.queue_tail = NULL;
}

static int keep_credentials(const uint8_t *bytes, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", lamp.credentials_path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    bool ok = fwrite(bytes, 1, len, f) == len;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, lamp.credentials_path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Says what went wrong when a call into the library did not succeed. */
static void check(dk_status status, const char *what) {
    if (status != DK_OK) fprintf(stderr, "lamp: %s: %s\n", what, dk_status_text(status));
}

/* Plans the next connection after the device core's backoff: a random
   delay up to 0.5 s, 1 s, 2 s, 4 s, then 8 s for every try after ("full
   jitter", as every dk device waits), so that a fleet of lamps does not
   reconnect in lockstep and a vessel back from a restart is found within
   seconds. */
static void connect_later(void) {
    uint64_t random = 0;
    random_bytes(NULL, (uint8_t *)&random, sizeof random);
    unsigned delay = dk_next_backoff_ms(500, 8000, lamp.attempts, random);
    lamp.attempts++;
    lamp.reconnect_at = now_ms() + delay;
    fprintf(stderr, "lamp: connecting again in %u ms\n", delay);
}

/* Closes the socket once what is queued is written: after
   DK_OUTPUT_ENDED nothing more is sent, and the library asks for no close
   of its own when it ends a connection without one (a handshake that
   timed out, a connection ended for want of memory). */
static void hang_up(void) {
    if (!lamp.wsi) return;
    lamp.hangup = true;
    lws_callback_on_writable(lamp.wsi);
}

/* Does what the device asks, in order. */
static void pump(void) {
    dk_output out;
    while (dk_device_poll(lamp.device, &out)) {
        switch (out.kind) {
        case DK_OUTPUT_SEND_TEXT:
        case DK_OUTPUT_SEND_BINARY:
        case DK_OUTPUT_SEND_CLOSE:
            enqueue(&out);
            break;
        case DK_OUTPUT_CONNECTED:
            if (lamp.handshakes) {
                lamp.handshake_us[lamp.handshakes_done++] = now_us() - lamp.handshake_started;
                check(dk_device_shutdown(lamp.device, now_ms()), "shutdown");
            } else {
                fprintf(stderr, "lamp: connected\n");
            }
            lamp.attempts = 0;
            break;
        case DK_OUTPUT_SHOW_CODE:
            printf("pairing code: %s\n", (const char *)out.data);
            fflush(stdout);
            break;
        case DK_OUTPUT_STORE:
            if (keep_credentials(out.data, out.len) != 0) {
                fprintf(stderr, "lamp: cannot write %s\n", lamp.credentials_path);
                check(dk_device_storage_failed(lamp.device, now_ms()), "storage failed");
            }
            break;
        case DK_OUTPUT_INVOKE: {
            const char *error = "no handler";
            check(dk_device_answer(lamp.device, out.call.call_id, out.call.call_id_len, false,
                                   error, strlen(error)),
                  "answer");
            break;
        }
        case DK_OUTPUT_NOTICE:
            fprintf(stderr, "lamp: %s\n", (const char *)out.data);
            break;
        case DK_OUTPUT_ENDED:
            fprintf(stderr, "lamp: ended: %s\n", (const char *)out.data);
            lamp.ended = true;
            hang_up();
            if (out.end == DK_END_STOP) {
                lamp.stop = true;
                lamp.exit_code = 3;
            } else if (out.end == DK_END_SHUTDOWN && lamp.handshakes &&
                       lamp.handshakes_done < lamp.handshakes) {
                lamp.reconnect_at = now_ms();
            } else if (out.end == DK_END_RETRY && !signalled) {
                connect_later();
            }
            break;
        default:
            break;
        }
    }
    if (!lamp.serving_seen && dk_device_state(lamp.device) == DK_STATE_SERVING) {
        lamp.serving_seen = true;
        lamp.pairing_peak = heap_peak;
    }
}

static void receive_done(void) {
    /* What the frame allocates: the most the heap grows while it is read
       and its outputs drained (calls run, answers sealed). */
    size_t before = heap_now, count_before = allocations;
    frame_peak = heap_now;
    if (lamp.rx_binary)
        check(dk_device_receive_binary(lamp.device, now_ms(), lamp.rx, lamp.rx_len), "receive");
    else
        check(dk_device_receive_text(lamp.device, now_ms(), (const char *)lamp.rx, lamp.rx_len),
              "receive");
    bool serving = lamp.serving_seen;
    pump();
    size_t grew = frame_peak - before;
    size_t beyond = grew > lamp.rx_len ? grew - lamp.rx_len : 0;
    size_t count = allocations - count_before;
    if (serving) {
        lamp.frames++;
        lamp.frame_alloc_total += beyond;
        if (beyond > lamp.frame_alloc_max) lamp.frame_alloc_max = beyond;
        if (count > lamp.frame_count_max) lamp.frame_count_max = count;
    }
    lamp.rx_len = 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len) {
    (void)user;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        lamp.wsi = wsi;
        lamp.ended = false;
        lamp.hangup = false;
        check(dk_device_connect(lamp.device, now_ms()), "connect");
        pump();
        break;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        if (lws_is_first_fragment(wsi)) {
            lamp.rx_len = 0;
            lamp.rx_binary = lws_frame_is_binary(wsi);
        }
        if (lamp.rx_len + len > DK_MAX_INPUT) return -1;
        if (lamp.rx_len + len > lamp.rx_cap) {
            size_t cap = lamp.rx_cap ? lamp.rx_cap : 4096;
            while (cap < lamp.rx_len + len) cap *= 2;
            unsigned char *grown = realloc(lamp.rx, cap);
            if (!grown) return -1;
            lamp.rx = grown;
            lamp.rx_cap = cap;
        }
        memcpy(lamp.rx + lamp.rx_len, in, len);
        lamp.rx_len += len;
        if (lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0) receive_done();
        break;
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        while (lamp.queue) {
            struct message *m = lamp.queue;
            if (m->kind == DK_OUTPUT_SEND_CLOSE) {
                if (m->close_code)
                    lws_close_reason(wsi, (enum lws_close_status)m->close_code,
                                     m->bytes + LWS_PRE, m->len);
                drop_queue();
                return -1;
            }
            enum lws_write_protocol kind =
                m->kind == DK_OUTPUT_SEND_BINARY ? LWS_WRITE_BINARY : LWS_WRITE_TEXT;
            if (lws_write(wsi, m->bytes + LWS_PRE, m->len, kind) < (int)m->len) return -1;
            lamp.queue = m->next;
            if (!lamp.queue) lamp.queue_tail = NULL;
            free(m);
            if (lws_send_pipe_choked(wsi)) {
                lws_callback_on_writable(wsi);
                return 0;
            }
        }
        /* The device ended the connection: the socket is the lamp's to
           close. */
        if (lamp.hangup) return -1;
        break;
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE: {
        uint16_t code = 0;
        const unsigned char *bytes = in;
        if (len >= 2) code = (uint16_t)(bytes[0] << 8 | bytes[1]);
        const char *why = len > 2 ? (const char *)bytes + 2 : NULL;
        check(dk_device_receive_close(lamp.device, now_ms(), code, why, len > 2 ? len - 2 : 0),
              "close");
        pump();
        break;
    }
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
        /* The vessel cannot be reached (down, restarting, refusing the
           upgrade): try again later, as after any end, unless the core's
           rule says the answer stops this device. */
        unsigned status = wsi ? lws_http_client_http_response(wsi) : 0;
        fprintf(stderr, "lamp: cannot reach the vessel: %s\n", in ? (const char *)in : "?");
        lamp.socket = false;
        lamp.wsi = NULL;
        drop_queue();
        if (status && dk_device_stops_on_http_status(lamp.device, (uint16_t)status)) {
            fprintf(stderr, "lamp: the vessel refused this device (HTTP %u): stopping\n", status);
            lamp.stop = true;
            lamp.exit_code = 3;
            break;
        }
        if (!signalled && !lamp.stop) connect_later();
        break;
    }
    case LWS_CALLBACK_CLIENT_CLOSED:
        lamp.socket = false;
        lamp.wsi = NULL;
        drop_queue();
        if (!lamp.ended) {
            check(dk_device_lost(lamp.device, now_ms()), "lost");
            pump();
        }
        break;
    default:
        break;
    }
    return 0;
}

static const struct lws_protocols protocols[] = {
    {"dk.2", callback, 0, 65536, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static char address[256], path[512], host[300];
static int port;

static void open_connection(void) {
    struct lws_client_connect_info info;
    memset(&info, 0, sizeof info);
    info.context = lamp.context;
    info.address = address;
    info.port = port;
    info.path = path;
    info.host = host; /* with the port: a loopback vessel checks it */
    /* No Origin: a device is not a browser page. */
    info.protocol = "dk.2";
    info.local_protocol_name = "dk.2";
    lamp.socket = true;
    lamp.ended = false;
    lamp.hangup = false;
    lamp.handshake_started = now_us();
    /* A connection that fails at once may have said so already, through
       LWS_CALLBACK_CLIENT_CONNECTION_ERROR. */
    if (!lws_client_connect_via_info(&info) && lamp.socket) {
        lamp.socket = false;
        connect_later();
    }
}

/* Wakes lws_service() when the lamp has something to do: the device's
   timer, the next connection, or a look for a signal every 250 ms. */
static void woken(lws_sorted_usec_list_t *sul) { (void)sul; }

static void arm_timer(void) {
    uint64_t now = now_ms(), next = now + 250, at;
    if (dk_device_next_timeout(lamp.device, &at) && at < next) next = at;
    if (lamp.reconnect_at && lamp.reconnect_at < next) next = lamp.reconnect_at;
    lws_sul_schedule(lamp.context, 0, &lamp.timer, woken,
                     (lws_usec_t)(next > now ? next - now : 0) * 1000);
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void write_stats(void) {
    if (!lamp.stats_path) return;
    FILE *f = fopen(lamp.stats_path, "w");
    if (!f) return;
    fprintf(f, "pairing_peak_bytes %zu\n", lamp.pairing_peak);
    fprintf(f, "idle_heap_bytes %zu\n", lamp.idle_heap);
    fprintf(f, "frames %zu\n", lamp.frames);
    fprintf(f, "frame_alloc_beyond_max_bytes %zu\n", lamp.frame_alloc_max);
    fprintf(f, "frame_alloc_beyond_mean_bytes %zu\n",
            lamp.frames ? lamp.frame_alloc_total / lamp.frames : 0);
    fprintf(f, "frame_allocations_max %zu\n", lamp.frame_count_max);
    fprintf(f, "heap_at_exit_bytes %zu\n", heap_now);
    if (lamp.handshakes_done) {
        qsort(lamp.handshake_us, lamp.handshakes_done, sizeof *lamp.handshake_us, by_value);
        fprintf(f, "handshakes %u\n", lamp.handshakes_done);
        fprintf(f, "handshake_median_us %llu\n",
                (unsigned long long)lamp.handshake_us[lamp.handshakes_done / 2]);
    }
    fclose(f);
}

static int usage(void) {
    fprintf(stderr, "usage: lamp ws://HOST:PORT/PATH CREDENTIALS_FILE [--stats FILE] "
                    "[--handshakes N] [--handshake-timeout-ms MS]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    lamp.credentials_path = argv[2];
    unsigned handshake_timeout_ms = 0;
    for (int i = 3; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        if (strcmp(argv[i], "--stats") == 0) {
            lamp.stats_path = argv[i + 1];
        } else if (strcmp(argv[i], "--handshakes") == 0) {
            lamp.handshakes = (unsigned)atoi(argv[i + 1]);
            if (lamp.handshakes < 1 || lamp.handshakes > 10000) return usage();
        } else if (strcmp(argv[i], "--handshake-timeout-ms") == 0) {
            handshake_timeout_ms = (unsigned)atoi(argv[i + 1]);
            if (handshake_timeout_ms < 1) return usage();
        } else {
            return usage();
        }
    }
    if (lamp.handshakes) {
        lamp.handshake_us = calloc(lamp.handshakes, sizeof *lamp.handshake_us);
        if (!lamp.handshake_us) return 2;
    }
    if (sscanf(argv[1], "ws://%255[^:/]:%d%511s", address, &port, path) < 2) return usage();
    if (!path[0]) strcpy(path, "/");
    snprintf(host, sizeof host, "%s:%d", address, port);

    dk_platform platform = {
        .ctx = NULL,
        .random = random_bytes,
        .alloc = count_alloc,
        .free = count_free,
        .log = log_line,
    };
    if (dk_platform_init(&platform) != DK_OK) return 2;

    uint8_t kept[DK_CREDENTIALS_BYTES];
    dk_options options;
    memset(&options, 0, sizeof options);
    FILE *f = fopen(lamp.credentials_path, "rb");
    if (f) {
        size_t n = fread(kept, 1, sizeof kept, f);
        fclose(f);
        options.credentials = kept;
        options.credentials_len = n;
    }
    /* A lamp's calls are small: a 16 KiB frame is plenty. */
    options.max_frame_bytes = 16384;
    options.max_in_flight = 4;
    options.remember_calls = 64;
    options.handshake_timeout_ms = handshake_timeout_ms;

    char error[256];
    dk_status made =
        dk_device_new(&platform, MANIFEST, strlen(MANIFEST), &options, &lamp.device, error,
                      sizeof error);
    explicit_bzero(kept, sizeof kept);
    if (made != DK_OK) {
        fprintf(stderr, "lamp: %s: %s\n", dk_status_text(made), error);
        return 2;
    }
    check(dk_device_on(lamp.device, "set_light", 9, set_light, NULL), "set_light");
    check(dk_device_on(lamp.device, "read_light", 10, read_light, NULL), "read_light");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info ci;
    memset(&ci, 0, sizeof ci);
    ci.port = CONTEXT_PORT_NO_LISTEN;
    ci.protocols = protocols;
    ci.gid = -1;
    ci.uid = -1;
    lamp.context = lws_create_context(&ci);
    if (!lamp.context) {
        dk_device_free(lamp.device);
        return 2;
    }

    int code = 0;
    open_connection();
    uint64_t shutdown_at = 0;
    while (code == 0) {
        arm_timer();
        lws_service(lamp.context, 0);
        uint64_t now = now_ms();
        uint64_t at;
        if (dk_device_next_timeout(lamp.device, &at) && now >= at) {
            check(dk_device_handle_timeout(lamp.device, now), "timeout");
            pump();
        }
        /* Connected, nothing to send, no call running: idle. */
        if (dk_device_state(lamp.device) == DK_STATE_SERVING && !lamp.queue)
            lamp.idle_heap = heap_now;
        if (signalled && !shutdown_at) {
            shutdown_at = now;
            lamp.reconnect_at = 0;
            if (lamp.wsi && !lamp.ended) {
                check(dk_device_shutdown(lamp.device, now), "shutdown");
                pump();
            } else {
                break;
            }
        }
        if (shutdown_at && (lamp.ended || !lamp.wsi || now - shutdown_at > 2000)) break;
        if (lamp.stop) {
            code = lamp.exit_code;
            break;
        }
        if (lamp.handshakes && lamp.handshakes_done == lamp.handshakes && lamp.ended) break;
        if (!lamp.socket && lamp.reconnect_at && now >= lamp.reconnect_at) {
            lamp.reconnect_at = 0;
            open_connection();
        }
    }
    lws_sul_cancel(&lamp.timer);
    lws_context_destroy(lamp.context);
    drop_queue();
    free(lamp.rx);
    dk_device_free(lamp.device);
    write_stats();
    free(lamp.handshake_us);
    if (heap_now != 0) fprintf(stderr, "lamp: %zu bytes of the library's memory not freed\n", heap_now);
    return code;
}
