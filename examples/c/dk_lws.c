/*
 * dk_lws.c: the runner every C example device shares (dk_lws.h): the
 * platform given to libdk_device.a, a libwebsockets connection to the
 * vessel, the device's outputs carried out, its timer, the backoff
 * between connections, the credentials file, signals, and --stats and
 * --handshakes for the firmware bench.
 *
 * Random bytes come from getrandom(2); the library's memory from malloc,
 * counted, and with --stats the counts are written to FILE at exit: the
 * heap's peak while pairing, the heap while connected and idle, and what
 * each received frame allocated. With --handshakes N it connects N times
 * one after the other, closing each once its handshake is done, and adds
 * the median time from opening the socket to the handshake's end to the
 * stats. --handshake-timeout-ms sets how long a handshake may take
 * (default 10000).
 *
 * A connection that ends, or that cannot be made (the vessel is down or
 * restarting), is tried again after the device core's backoff
 * (dk_next_backoff_ms): a random delay up to 0.5 s, 1 s, 2 s, 4 s and
 * then 8 s, back to 0.5 s once connected. An HTTP 403 at the upgrade
 * stops an unpaired device (exit 3) and never a device paired over dk/2,
 * to which anyone on the path could forge one
 * (dk_device_stops_on_http_status).
 *
 * Time is kept by an lws timer (lws_sul_schedule) armed for the device's
 * next timeout, the next reconnection and the device's periodic hook:
 * libwebsockets ignores lws_service()'s timeout argument since 3.2, so a
 * loop that counts on it to come back would sleep through the
 * handshake's deadline.
 *
 * SIGTERM or SIGINT closes the connection (after the device's shutdown
 * grace, for calls answered later) and frees everything.
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

#include "dk_lws.h"

/* The device being run. */
static const struct dk_lws_device *device;

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
    fprintf(stderr, "%s: %.*s\n", device->name, (int)len, text);
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

const char *dk_lws_json_field(const char *json, size_t len, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *found = memmem(json, len, quoted, strlen(quoted));
    if (!found) return NULL;
    found += strlen(quoted);
    while (found < json + len && (*found == ' ' || *found == ':')) found++;
    return found < json + len ? found : NULL;
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
    /* when the device's periodic hook runs next */
    uint64_t next_tick;
    lws_sorted_usec_list_t timer;
    /* --handshakes: how many are left, when this one started, the times */
    unsigned handshakes, handshakes_done;
    uint64_t handshake_started, *handshake_us;
    /* the stats */
    size_t pairing_peak, idle_heap, frames, frame_alloc_max, frame_alloc_total, frame_count_max;
} run;

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
    if (run.queue_tail)
        run.queue_tail->next = m;
    else
        run.queue = m;
    run.queue_tail = m;
    if (run.wsi) lws_callback_on_writable(run.wsi);
}

static void drop_queue(void) {
    while (run.queue) {
        struct message *next = run.queue->next;
        free(run.queue);
        run.queue = next;
    }
    run.queue_tail = NULL;
}

static int keep_credentials(const uint8_t *bytes, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", run.credentials_path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    bool ok = fwrite(bytes, 1, len, f) == len;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, run.credentials_path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

void dk_lws_check(dk_status status, const char *what) {
    if (status != DK_OK) fprintf(stderr, "%s: %s: %s\n", device->name, what, dk_status_text(status));
}

/* Plans the next connection after the device core's backoff: a random
   delay up to 0.5 s, 1 s, 2 s, 4 s, then 8 s for every try after ("full
   jitter", as every dk device waits), so that a fleet of devices does not
   reconnect in lockstep and a vessel back from a restart is found within
   seconds. */
static void connect_later(void) {
    uint64_t random = 0;
    random_bytes(NULL, (uint8_t *)&random, sizeof random);
    unsigned delay = dk_next_backoff_ms(500, 8000, run.attempts, random);
    run.attempts++;
    run.reconnect_at = now_ms() + delay;
    fprintf(stderr, "%s: connecting again in %u ms\n", device->name, delay);
}

/* Closes the socket once what is queued is written: after
   DK_OUTPUT_ENDED nothing more is sent, and the library asks for no close
   of its own when it ends a connection without one (a handshake that
   timed out, a connection ended for want of memory). */
static void hang_up(void) {
    if (!run.wsi) return;
    run.hangup = true;
    lws_callback_on_writable(run.wsi);
}

/* Does what the device asks, in order. */
static void pump(void) {
    dk_output out;
    while (dk_device_poll(run.device, &out)) {
        switch (out.kind) {
        case DK_OUTPUT_SEND_TEXT:
        case DK_OUTPUT_SEND_BINARY:
        case DK_OUTPUT_SEND_CLOSE:
            enqueue(&out);
            break;
        case DK_OUTPUT_CONNECTED:
            if (run.handshakes) {
                run.handshake_us[run.handshakes_done++] = now_us() - run.handshake_started;
                dk_lws_check(dk_device_shutdown(run.device, now_ms()), "shutdown");
            } else {
                fprintf(stderr, "%s: connected\n", device->name);
            }
            run.attempts = 0;
            break;
        case DK_OUTPUT_SHOW_CODE:
            printf("pairing code: %s\n", (const char *)out.data);
            fflush(stdout);
            break;
        case DK_OUTPUT_STORE:
            if (keep_credentials(out.data, out.len) != 0) {
                fprintf(stderr, "%s: cannot write %s\n", device->name, run.credentials_path);
                dk_lws_check(dk_device_storage_failed(run.device, now_ms()), "storage failed");
            }
            break;
        case DK_OUTPUT_INVOKE: {
            const char *error = "no handler";
            dk_lws_check(dk_device_answer(run.device, out.call.call_id, out.call.call_id_len, false,
                                   error, strlen(error)),
                  "answer");
            break;
        }
        case DK_OUTPUT_NOTICE:
            fprintf(stderr, "%s: %s\n", device->name, (const char *)out.data);
            break;
        case DK_OUTPUT_ENDED:
            fprintf(stderr, "%s: ended: %s\n", device->name, (const char *)out.data);
            run.ended = true;
            hang_up();
            if (out.end == DK_END_STOP) {
                run.stop = true;
                run.exit_code = 3;
            } else if (out.end == DK_END_SHUTDOWN && run.handshakes &&
                       run.handshakes_done < run.handshakes) {
                run.reconnect_at = now_ms();
            } else if (out.end == DK_END_RETRY && !signalled) {
                connect_later();
            }
            break;
        default:
            break;
        }
    }
    if (!run.serving_seen && dk_device_state(run.device) == DK_STATE_SERVING) {
        run.serving_seen = true;
        run.pairing_peak = heap_peak;
    }
}

static void receive_done(void) {
    /* What the frame allocates: the most the heap grows while it is read
       and its outputs drained (calls run, answers sealed). */
    size_t before = heap_now, count_before = allocations;
    frame_peak = heap_now;
    if (run.rx_binary)
        dk_lws_check(dk_device_receive_binary(run.device, now_ms(), run.rx, run.rx_len), "receive");
    else
        dk_lws_check(dk_device_receive_text(run.device, now_ms(), (const char *)run.rx, run.rx_len),
              "receive");
    bool serving = run.serving_seen;
    pump();
    size_t grew = frame_peak - before;
    size_t beyond = grew > run.rx_len ? grew - run.rx_len : 0;
    size_t count = allocations - count_before;
    if (serving) {
        run.frames++;
        run.frame_alloc_total += beyond;
        if (beyond > run.frame_alloc_max) run.frame_alloc_max = beyond;
        if (count > run.frame_count_max) run.frame_count_max = count;
    }
    run.rx_len = 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len) {
    (void)user;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        run.wsi = wsi;
        run.ended = false;
        run.hangup = false;
        dk_lws_check(dk_device_connect(run.device, now_ms()), "connect");
        pump();
        break;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        if (lws_is_first_fragment(wsi)) {
            run.rx_len = 0;
            run.rx_binary = lws_frame_is_binary(wsi);
        }
        if (run.rx_len + len > DK_MAX_INPUT) return -1;
        if (run.rx_len + len > run.rx_cap) {
            size_t cap = run.rx_cap ? run.rx_cap : 4096;
            while (cap < run.rx_len + len) cap *= 2;
            unsigned char *grown = realloc(run.rx, cap);
            if (!grown) return -1;
            run.rx = grown;
            run.rx_cap = cap;
        }
        memcpy(run.rx + run.rx_len, in, len);
        run.rx_len += len;
        if (lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0) receive_done();
        break;
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        while (run.queue) {
            struct message *m = run.queue;
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
            run.queue = m->next;
            if (!run.queue) run.queue_tail = NULL;
            free(m);
            if (lws_send_pipe_choked(wsi)) {
                lws_callback_on_writable(wsi);
                return 0;
            }
        }
        /* The device ended the connection: the socket is the runner's to
           close. */
        if (run.hangup) return -1;
        break;
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE: {
        uint16_t code = 0;
        const unsigned char *bytes = in;
        if (len >= 2) code = (uint16_t)(bytes[0] << 8 | bytes[1]);
        const char *why = len > 2 ? (const char *)bytes + 2 : NULL;
        dk_lws_check(dk_device_receive_close(run.device, now_ms(), code, why, len > 2 ? len - 2 : 0),
              "close");
        pump();
        break;
    }
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
        /* The vessel cannot be reached (down, restarting, refusing the
           upgrade): try again later, as after any end, unless the core's
           rule says the answer stops this device. */
        unsigned status = wsi ? lws_http_client_http_response(wsi) : 0;
        fprintf(stderr, "%s: cannot reach the vessel: %s\n", device->name, in ? (const char *)in : "?");
        run.socket = false;
        run.wsi = NULL;
        drop_queue();
        if (status && dk_device_stops_on_http_status(run.device, (uint16_t)status)) {
            fprintf(stderr, "%s: the vessel refused this device (HTTP %u): stopping\n", device->name, status);
            run.stop = true;
            run.exit_code = 3;
            break;
        }
        if (!signalled && !run.stop) connect_later();
        break;
    }
    case LWS_CALLBACK_CLIENT_CLOSED:
        run.socket = false;
        run.wsi = NULL;
        drop_queue();
        if (!run.ended) {
            dk_lws_check(dk_device_lost(run.device, now_ms()), "lost");
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
    info.context = run.context;
    info.address = address;
    info.port = port;
    info.path = path;
    info.host = host; /* with the port: a loopback vessel checks it */
    /* No Origin: a device is not a browser page. */
    info.protocol = "dk.2";
    info.local_protocol_name = "dk.2";
    run.socket = true;
    run.ended = false;
    run.hangup = false;
    run.handshake_started = now_us();
    /* A connection that fails at once may have said so already, through
       LWS_CALLBACK_CLIENT_CONNECTION_ERROR. */
    if (!lws_client_connect_via_info(&info) && run.socket) {
        run.socket = false;
        connect_later();
    }
}

/* Wakes lws_service() when the device has something to do: the device's
   timer, the next connection, or a look for a signal every 250 ms. */
static void woken(lws_sorted_usec_list_t *sul) { (void)sul; }

static void arm_timer(void) {
    uint64_t now = now_ms(), next = now + 250, at;
    if (dk_device_next_timeout(run.device, &at) && at < next) next = at;
    if (run.reconnect_at && run.reconnect_at < next) next = run.reconnect_at;
    if (device->every && dk_device_state(run.device) == DK_STATE_SERVING && run.next_tick < next)
        next = run.next_tick;
    lws_sul_schedule(run.context, 0, &run.timer, woken,
                     (lws_usec_t)(next > now ? next - now : 0) * 1000);
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void write_stats(void) {
    if (!run.stats_path) return;
    FILE *f = fopen(run.stats_path, "w");
    if (!f) return;
    fprintf(f, "pairing_peak_bytes %zu\n", run.pairing_peak);
    fprintf(f, "idle_heap_bytes %zu\n", run.idle_heap);
    fprintf(f, "frames %zu\n", run.frames);
    fprintf(f, "frame_alloc_beyond_max_bytes %zu\n", run.frame_alloc_max);
    fprintf(f, "frame_alloc_beyond_mean_bytes %zu\n",
            run.frames ? run.frame_alloc_total / run.frames : 0);
    fprintf(f, "frame_allocations_max %zu\n", run.frame_count_max);
    fprintf(f, "heap_at_exit_bytes %zu\n", heap_now);
    if (run.handshakes_done) {
        qsort(run.handshake_us, run.handshakes_done, sizeof *run.handshake_us, by_value);
        fprintf(f, "handshakes %u\n", run.handshakes_done);
        fprintf(f, "handshake_median_us %llu\n",
                (unsigned long long)run.handshake_us[run.handshakes_done / 2]);
    }
    fclose(f);
}

static int usage(void) {
    fprintf(stderr, "usage: %s ws://HOST:PORT/PATH CREDENTIALS_FILE [--stats FILE] "
                    "[--handshakes N] [--handshake-timeout-ms MS]\n", device->name);
    return 2;
}

int dk_lws_run(const struct dk_lws_device *run_device, int argc, char **argv) {
    device = run_device;
    if (argc < 3) return usage();
    run.credentials_path = argv[2];
    unsigned handshake_timeout_ms = 0;
    for (int i = 3; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        if (strcmp(argv[i], "--stats") == 0) {
            run.stats_path = argv[i + 1];
        } else if (strcmp(argv[i], "--handshakes") == 0) {
            run.handshakes = (unsigned)atoi(argv[i + 1]);
            if (run.handshakes < 1 || run.handshakes > 10000) return usage();
        } else if (strcmp(argv[i], "--handshake-timeout-ms") == 0) {
            handshake_timeout_ms = (unsigned)atoi(argv[i + 1]);
            if (handshake_timeout_ms < 1) return usage();
        } else {
            return usage();
        }
    }
    if (run.handshakes) {
        run.handshake_us = calloc(run.handshakes, sizeof *run.handshake_us);
        if (!run.handshake_us) return 2;
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
    FILE *f = fopen(run.credentials_path, "rb");
    if (f) {
        size_t n = fread(kept, 1, sizeof kept, f);
        fclose(f);
        options.credentials = kept;
        options.credentials_len = n;
    }
    options.max_frame_bytes = device->max_frame_bytes;
    options.max_in_flight = device->max_in_flight;
    options.remember_calls = device->remember_calls;
    options.handshake_timeout_ms = handshake_timeout_ms;

    char error[256];
    dk_status made = dk_device_new(&platform, device->manifest, strlen(device->manifest), &options,
                                   &run.device, error, sizeof error);
    explicit_bzero(kept, sizeof kept);
    if (made != DK_OK) {
        fprintf(stderr, "%s: %s: %s\n", device->name, dk_status_text(made), error);
        return 2;
    }
    device->handlers(run.device);

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
    run.context = lws_create_context(&ci);
    if (!run.context) {
        dk_device_free(run.device);
        return 2;
    }

    int code = 0;
    open_connection();
    uint64_t shutdown_at = 0;
    /* How long after the signal the runner waits for the connection's end
       at most: the calls' grace, then the close's 2 s. */
    uint64_t patience = device->shutdown_grace_ms + 2000;
    while (code == 0) {
        arm_timer();
        lws_service(run.context, 0);
        uint64_t now = now_ms();
        uint64_t at;
        if (dk_device_next_timeout(run.device, &at) && now >= at) {
            dk_lws_check(dk_device_handle_timeout(run.device, now), "timeout");
            pump();
        }
        /* The device's periodic hook, while a connection serves. */
        if (device->every && !shutdown_at &&
            dk_device_state(run.device) == DK_STATE_SERVING && now >= run.next_tick) {
            run.next_tick = now + device->every_ms;
            device->every(run.device, now);
            pump();
        }
        /* Connected, nothing to send, no call running: idle. */
        if (dk_device_state(run.device) == DK_STATE_SERVING && !run.queue)
            run.idle_heap = heap_now;
        if (signalled && !shutdown_at) {
            shutdown_at = now;
            run.reconnect_at = 0;
            if (run.wsi && !run.ended) {
                if (device->shutdown_grace_ms)
                    dk_lws_check(
                        dk_device_shutdown_within(run.device, now, device->shutdown_grace_ms),
                        "shutdown");
                else
                    dk_lws_check(dk_device_shutdown(run.device, now), "shutdown");
                pump();
            } else {
                break;
            }
        }
        if (shutdown_at && (run.ended || !run.wsi || now - shutdown_at > patience)) break;
        if (run.stop) {
            code = run.exit_code;
            break;
        }
        if (run.handshakes && run.handshakes_done == run.handshakes && run.ended) break;
        if (!run.socket && run.reconnect_at && now >= run.reconnect_at) {
            run.reconnect_at = 0;
            open_connection();
        }
    }
    lws_sul_cancel(&run.timer);
    lws_context_destroy(run.context);
    drop_queue();
    free(run.rx);
    dk_device_free(run.device);
    write_stats();
    free(run.handshake_us);
    if (heap_now != 0)
        fprintf(stderr, "%s: %zu bytes of the library's memory not freed\n", device->name,
                heap_now);
    return code;
}
