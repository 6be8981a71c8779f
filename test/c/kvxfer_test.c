/* The C ABI's test program (`make ctest`): every check prints what it saw
 * and the program exits 1 on the first failure. Built against
 * include/kvxfer.h and lib/libkvxfer.so. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer.h"

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, " (last error: %s)\n", kvxfer_last_error());  \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

#define OK(call)                                                          \
    do {                                                                  \
        kvxfer_status st_ = (call);                                       \
        CHECK(st_ == KVXFER_OK, "%s returned %s", #call, kvxfer_status_name(st_)); \
    } while (0)

static const char *LAYOUT =
    "\"layout\":{\"layers\":2,\"kv_heads\":2,\"head_dim\":4,\"dtype_bytes\":2,\"tokens_per_block\":16}";

static kvxfer_engine_t open_engine(const char *instance, void *pool, uint64_t pool_bytes) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "{\"instance\":\"%s\",%s,\"pool_bytes\":%llu,\"transfer_timeout_ms\":10000}",
             instance, LAYOUT, (unsigned long long)pool_bytes);
    kvxfer_engine_t e = 0;
    OK(kvxfer_engine_open(cfg, pool, pool_bytes, &e));
    CHECK(e != 0, "engine handle 0");
    return e;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Polls e until the event of request r arrives (10 s deadline). */
static kvxfer_event wait_event(kvxfer_engine_t e, kvxfer_request_t r) {
    double deadline = now() + 10;
    while (now() < deadline) {
        kvxfer_event ev[8];
        uint32_t got = 0;
        OK(kvxfer_poll(e, ev, 8, &got, 100));
        for (uint32_t i = 0; i < got; i++) {
            if (ev[i].request == r) return ev[i];
            fprintf(stderr, "unexpected event for request %llu\n", (unsigned long long)ev[i].request);
            exit(1);
        }
    }
    CHECK(0, "no event for request %llu in 10 s", (unsigned long long)r);
    kvxfer_event none = {0};
    return none;
}

static uint8_t pattern(int req, uint64_t block, uint64_t byte) { return (uint8_t)(req * 31 + block * 7 + byte * 13 + 1); }

/* Checks every byte of d's blocks dst[0..n) of group dgi against
 * request req's pattern; returns how many bytes it checked. */
static uint64_t check_blocks(kvxfer_engine_t d, const kvxfer_group_info *dgi, const int32_t *dst, uint32_t n, int req) {
    kvxfer_engine_info dinfo;
    OK(kvxfer_engine_info_get(d, &dinfo));
    const uint8_t *dpool = (const uint8_t *)(uintptr_t)dinfo.pool_base;
    uint64_t checked = 0;
    for (uint32_t b = 0; b < n; b++)
        for (uint64_t i = 0; i < dgi->block_bytes; i++, checked++)
            CHECK(dpool[dgi->offset + dst[b] * dgi->block_bytes + i] == pattern(req, b, i), "block %u byte %llu", b,
                  (unsigned long long)i);
    return checked;
}

static void *thread_error(void *arg) {
    (void)arg;
    kvxfer_status st = kvxfer_cancel(777777);
    if (st != KVXFER_ERR_BAD_HANDLE || !strstr(kvxfer_last_error(), "777777")) return (void *)1;
    return NULL;
}

/* Whether s is UTF-8 (no lone or cut multi-byte sequence). */
static int utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2 : (*p & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0) return 0;
        p++;
        for (; n > 0; n--, p++)
            if ((*p & 0xC0) != 0x80) return 0;
    }
    return 1;
}

static void test_bad_input(void) {
    kvxfer_engine_t e = 0;
    CHECK(kvxfer_abi_version() == KVXFER_ABI_VERSION, "abi %d, header %d", kvxfer_abi_version(), KVXFER_ABI_VERSION);
    CHECK(kvxfer_engine_open(NULL, NULL, 0, &e) == KVXFER_ERR_INVALID_ARGUMENT, "NULL config");
    CHECK(strstr(kvxfer_last_error(), "config_json"), "message names the argument");
    CHECK(kvxfer_engine_open("{\"model\": ", NULL, 0, &e) == KVXFER_ERR_CONFIG, "truncated JSON");
    CHECK(kvxfer_engine_open("{\"modle\":\"x\"}", NULL, 0, &e) == KVXFER_ERR_CONFIG, "unknown key");
    CHECK(strstr(kvxfer_last_error(), "modle"), "message names the unknown key");
    CHECK(kvxfer_engine_open("{\"model\":\"no-such-model\"}", NULL, 0, &e) == KVXFER_ERR_CONFIG, "unknown model");
    CHECK(strstr(kvxfer_last_error(), "no-such-model"), "message names the model");
    /* A long value (a 1400-byte model name) is quoted by its first 64
     * bytes, cut before a character, never inside one (with each of the two
     * offsets of a 2-byte character at the cut), and its length: the
     * reason after it fits in the thread's buffer. */
    for (int shift = 0; shift < 2; shift++) {
        char longcfg[2048];
        int k = snprintf(longcfg, sizeof longcfg, "{\"model\":\"%s", shift ? "x" : "");
        for (int i = 0; i < 700; i++) k += snprintf(longcfg + k, sizeof longcfg - k, "\xc3\xa9");
        snprintf(longcfg + k, sizeof longcfg - k, "\"}");
        CHECK(kvxfer_engine_open(longcfg, NULL, 0, &e) == KVXFER_ERR_CONFIG, "long unknown model");
        const char *m = kvxfer_last_error();
        CHECK(strlen(m) <= 300 && utf8_valid(m) && strstr(m, shift ? "(1401 bytes)" : "(1400 bytes)") &&
                  strstr(m, "(known: "),
              "a long value (shift %d): %zu bytes, valid UTF-8 %d: %s", shift, strlen(m), utf8_valid(m), m);
    }
    /* A pool below the first page is no memory: refused naming it (held as
     * a Go pointer, such an address once aborted the process). */
    char lowcfg[256];
    snprintf(lowcfg, sizeof lowcfg, "{\"instance\":\"c-low\",%s}", LAYOUT);
    CHECK(kvxfer_engine_open(lowcfg, (void *)(uintptr_t)16, 4096, &e) == KVXFER_ERR_INVALID_ARGUMENT, "pool at 0x10");
    CHECK(strstr(kvxfer_last_error(), "pool = 0x10"), "message names the pool: %s", kvxfer_last_error());
    CHECK(kvxfer_handle_count() == 0, "a refused open left a handle");
    CHECK(kvxfer_node_open("{}", &e) == KVXFER_ERR_CONFIG, "node_open without a model");
    CHECK(strstr(kvxfer_last_error(), "model"), "message names the field: %s", kvxfer_last_error());
    char ep[64];
    CHECK(kvxfer_node_endpoint(999999, ep, sizeof ep) == KVXFER_ERR_BAD_HANDLE, "endpoint of a bad handle");
    char pub[41], sec[41];
    OK(kvxfer_keygen(pub, sec));
    CHECK(strlen(pub) == 40 && strlen(sec) == 40 && strcmp(pub, sec) != 0, "keygen: %s", pub);
    CHECK(kvxfer_engine_close(424242, 100) == KVXFER_ERR_BAD_HANDLE, "close a bad handle");
    CHECK(strstr(kvxfer_last_error(), "424242"), "message names the handle");
    CHECK(kvxfer_poll(1, NULL, 4, NULL, 0) == KVXFER_ERR_INVALID_ARGUMENT, "poll NULL got");
    /* Each thread keeps its own message. */
    CHECK(kvxfer_send(99, NULL, NULL) == KVXFER_ERR_INVALID_ARGUMENT, "send NULL req");
    pthread_t t;
    void *res;
    pthread_create(&t, NULL, thread_error, NULL);
    pthread_join(t, &res);
    CHECK(res == NULL, "the other thread saw its own message");
    CHECK(strstr(kvxfer_last_error(), "req"), "this thread kept its message: %s", kvxfer_last_error());
    CHECK(strcmp(kvxfer_status_name(KVXFER_ERR_BAD_CHUNK), "KVXFER_ERR_BAD_CHUNK") == 0, "status name");
    CHECK(strcmp(kvxfer_status_name(-3), "KVXFER_ERR_UNKNOWN") == 0, "unknown status name");
    /* Every code the header declares has its name (KVXFER_ERR_PEER_FAILED,
     * the last added, was once "KVXFER_ERR_UNKNOWN"). */
    CHECK(strcmp(kvxfer_status_name(KVXFER_ERR_PEER_FAILED), "KVXFER_ERR_PEER_FAILED") == 0, "status name 21: %s",
          kvxfer_status_name(KVXFER_ERR_PEER_FAILED));
    for (int32_t code = KVXFER_OK; code <= KVXFER_ERR_PEER_FAILED; code++)
        CHECK(strncmp(kvxfer_status_name(code), "KVXFER_", 7) == 0 &&
                  strcmp(kvxfer_status_name(code), "KVXFER_ERR_UNKNOWN") != 0,
              "status %d is named %s", code, kvxfer_status_name(code));
    CHECK(strcmp(kvxfer_status_name(KVXFER_ERR_PEER_FAILED + 1), "KVXFER_ERR_UNKNOWN") == 0, "status past the last");
    /* Every call with a bad handle or a NULL output is an error, never a crash. */
    kvxfer_status st[] = {
        kvxfer_engine_info_get(5555, NULL),
        kvxfer_engine_info_get(5555, &(kvxfer_engine_info){0}),
        kvxfer_engine_group(5555, 0, NULL),
        kvxfer_blocks_alloc(5555, 0, 4, NULL),
        kvxfer_blocks_free(5555, 0, NULL, 4),
        kvxfer_blocks_used(5555, 0, NULL),
        kvxfer_send(5555, &(kvxfer_send_request){.id = "x", .prompt_len = 16}, &(kvxfer_request_t){0}),
        kvxfer_send(5555, &(kvxfer_send_request){.id = NULL}, &(kvxfer_request_t){0}),
        kvxfer_send_parallel(5555, &(kvxfer_send_request){.id = "x", .prompt_len = 16}, 1, 1, &(kvxfer_request_t){0}),
        kvxfer_receive(5555, &(kvxfer_receive_request){.id = "x", .context = NULL}, &(kvxfer_request_t){0}),
        kvxfer_chunk(5555, 0, 16, 1, NULL, 0, NULL),
        kvxfer_chunk_cuda(5555, 0, 16, 1, NULL, 0, 0, 0),
        kvxfer_chunk_layers(5555, 0, 16, 1, 0, 1, 2, NULL, 0, NULL),
        kvxfer_chunk_layers_cuda(5555, 0, 16, 1, 0, 1, 2, NULL, 0, 0, 0),
        kvxfer_fence_ready(5555),
        kvxfer_fence_fail(5555, NULL),
        kvxfer_set_callback(5555, NULL, NULL),
        kvxfer_request_blocks(5555, 0, NULL, 4, &(uint32_t){0}, NULL),
        kvxfer_request_payload(5555, NULL, 0, NULL),
        kvxfer_request_error(5555, NULL, 0),
        kvxfer_request_release(5555),
        kvxfer_bench_go(5555, 5556, 16, 16, 1, NULL, NULL),
        kvxfer_engine_stats_get(5555, NULL),
        kvxfer_engine_stats_get(5555, &(kvxfer_engine_stats){0}),
        kvxfer_engine_stats_ext_get(5555, NULL, NULL, 0, NULL),
        kvxfer_engine_stats_ext_get(5555, &(kvxfer_engine_stats){0}, &(kvxfer_engine_stats_ext){0},
                                    sizeof(kvxfer_engine_stats_ext), NULL),
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        CHECK(st[i] == KVXFER_ERR_BAD_HANDLE || st[i] == KVXFER_ERR_INVALID_ARGUMENT, "call %zu returned %s", i,
              kvxfer_status_name(st[i]));
    printf("ok   bad input: status codes and per-thread messages\n");
}

static int callback_events;
static void on_event(const kvxfer_event *ev, void *user) {
    (void)ev;
    __atomic_add_fetch((int *)user, 1, __ATOMIC_SEQ_CST);
}

/* Requests refused at the call, naming the value, with nothing opened: a
 * payload past the limit (2^31 bytes and more used to crash the library),
 * negative timeouts and parallelism, an id so long that the message
 * buffer (1023 bytes) must show only its start to keep the reason. */
static void test_refused_requests(kvxfer_engine_t p, kvxfer_engine_t d) {
    uint64_t handles = kvxfer_handle_count();
    kvxfer_request_t r = 0;
    char buf[16] = {0};
    uint32_t lens[] = {65537, 0x80000000u, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        char want[32];
        snprintf(want, sizeof want, "= %u bytes", lens[i]);
        kvxfer_send_request sr = {.id = "c-big", .prompt_len = 32, .payload = buf, .payload_len = lens[i]};
        kvxfer_status st = kvxfer_send(p, &sr, &r);
        CHECK(st == KVXFER_ERR_INVALID_ARGUMENT, "payload_len %u returned %s", lens[i], kvxfer_status_name(st));
        CHECK(strstr(kvxfer_last_error(), want) && strstr(kvxfer_last_error(), "65536"),
              "message names the length and the limit: %s", kvxfer_last_error());
    }
    CHECK(kvxfer_send(p, &(kvxfer_send_request){.id = "c-neg", .prompt_len = 32, .timeout_ms = -1}, &r) ==
              KVXFER_ERR_INVALID_ARGUMENT, "send timeout_ms -1");
    CHECK(strstr(kvxfer_last_error(), "timeout_ms = -1"), "message names the timeout: %s", kvxfer_last_error());
    CHECK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-neg", .prompt_len = 32, .context = "c-prefill",
                                                       .timeout_ms = -5}, &r) == KVXFER_ERR_INVALID_ARGUMENT,
          "receive timeout_ms -5");
    CHECK(strstr(kvxfer_last_error(), "timeout_ms = -5"), "message names the timeout: %s", kvxfer_last_error());
    CHECK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-neg", .prompt_len = 32, .context = "c-prefill",
                                                       .context_tp = -1}, &r) == KVXFER_ERR_INVALID_ARGUMENT,
          "receive context_tp -1");
    CHECK(strstr(kvxfer_last_error(), "context_tp = -1"), "message names context_tp: %s", kvxfer_last_error());
    /* kvxfer_receive_stages: a context split of the wrong stage count (the
     * model has 2 layers) is refused naming it; NULL is kvxfer_receive's. */
    CHECK(kvxfer_receive_stages(d, &(kvxfer_receive_request){.id = "c-neg", .prompt_len = 32, .context = "c-prefill",
                                                              .context_tp = 1, .context_pp = 2}, "2", &r) ==
              KVXFER_ERR_INVALID_ARGUMENT, "receive_stages \"2\" over context_pp 2");
    CHECK(strstr(kvxfer_last_error(), "context_pp_stages \"2\""), "message names the split: %s", kvxfer_last_error());
    CHECK(kvxfer_receive_stages(d, &(kvxfer_receive_request){.id = "c-neg", .prompt_len = 32, .context = "c-prefill",
                                                              .timeout_ms = -5}, NULL, &r) == KVXFER_ERR_INVALID_ARGUMENT,
          "receive_stages timeout_ms -5");
    CHECK(strstr(kvxfer_last_error(), "kvxfer_receive_stages: req->timeout_ms = -5"), "message names the call: %s",
          kvxfer_last_error());
    char id[5001];
    memset(id, 'x', 5000);
    id[5000] = 0;
    CHECK(kvxfer_send(p, &(kvxfer_send_request){.id = id, .prompt_len = 32}, &r) == KVXFER_ERR_BAD_REQUEST, "long id");
    const char *msg = kvxfer_last_error();
    /* Read no further than the longest id and its NUL (test_id_without_nul):
     * named by its first 64 bytes and the bound. */
    CHECK(strlen(msg) < 300 && strstr(msg, "req->id \"xxxx") && strstr(msg, "longer than 256 bytes"),
          "a long id is shown clipped, the reason kept (%zu bytes): %.300s", strlen(msg), msg);
    CHECK(r == 0 && kvxfer_handle_count() == handles, "a refused request left a handle");
    printf("ok   refused requests: payload, negative timeouts and parallelism, a long id named\n");
}

/* A request id is 1 to 256 bytes (kvxfer.h): the library reads at most
 * 257 bytes of one, the longest id and its NUL. An id with no NUL in them
 * is refused naming it, and no byte past them is read: each id below ends
 * at a page that is not mapped. The library read an id up to its first
 * NUL wherever that was (strlen), past the end of the caller's buffer, and
 * an id with no NUL before the unmapped page crashed the process. An id of
 * 256 bytes, its NUL the page's last byte, is taken. */
static void test_id_without_nul(void) {
    uint64_t handles = kvxfer_handle_count();
    kvxfer_engine_t p = open_engine("c-nul-prefill", NULL, 1 << 20);
    kvxfer_engine_t d = open_engine("c-nul-decode", NULL, 1 << 20);
    long page = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED, "mmap of two pages");
    CHECK(mprotect(m + page, page, PROT_NONE) == 0, "mprotect of the second page");
    char *id = m + page - 257; /* 257 bytes, no NUL, then the unmapped page */
    memset(id, 'a', 257);
    kvxfer_request_t r = 0;
    CHECK(kvxfer_send(p, &(kvxfer_send_request){.id = id, .prompt_len = 32}, &r) == KVXFER_ERR_BAD_REQUEST,
          "send of an id with no NUL in 257 bytes");
    CHECK(strstr(kvxfer_last_error(), "kvxfer_send: req->id \"aaaa") && strstr(kvxfer_last_error(), "longer than 256 bytes"),
          "message names the id and the bound: %s", kvxfer_last_error());
    CHECK(kvxfer_receive(d, &(kvxfer_receive_request){.id = id, .prompt_len = 32, .context = "c-nul-prefill"}, &r) ==
              KVXFER_ERR_BAD_REQUEST,
          "receive of an id with no NUL in 257 bytes");
    CHECK(strstr(kvxfer_last_error(), "kvxfer_receive: req->id") && strstr(kvxfer_last_error(), "longer than 256 bytes"),
          "message names the call, the id and the bound: %s", kvxfer_last_error());
    CHECK(r == 0 && kvxfer_handle_count() == handles + 2, "a refused request left a handle");
    id[256] = 0; /* 256 bytes and the NUL, the page's last byte */
    kvxfer_request_t tx = 0, rx = 0;
    OK(kvxfer_send(p, &(kvxfer_send_request){.id = id, .prompt_len = 32}, &tx));
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = id, .prompt_len = 32, .context = "c-nul-nobody"}, &rx));
    OK(kvxfer_cancel(tx));
    OK(kvxfer_cancel(rx));
    CHECK(wait_event(p, tx).outcome == KVXFER_OUTCOME_CANCELLED, "a 256-byte id's send not cancelled");
    CHECK(wait_event(d, rx).outcome == KVXFER_OUTCOME_CANCELLED, "a 256-byte id's receive not cancelled");
    OK(kvxfer_request_release(tx));
    OK(kvxfer_request_release(rx));
    OK(kvxfer_engine_close(p, 5000));
    OK(kvxfer_engine_close(d, 5000));
    CHECK(munmap(m, 2 * page) == 0, "munmap");
    CHECK(kvxfer_handle_count() == handles, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   an id with no NUL in its first 257 bytes refused, nothing past them read\n");
}

/* A transfer from caller-owned pool memory to an engine-allocated pool,
 * fenced chunks, payload, data verified byte for byte. */
static void test_transfer(void) {
    uint64_t pool_bytes = 1 << 20;
    uint8_t *pool = aligned_alloc(4096, pool_bytes);
    kvxfer_engine_t p = open_engine("c-prefill", pool, pool_bytes);
    kvxfer_engine_t d = open_engine("c-decode", NULL, pool_bytes);
    kvxfer_engine_info info;
    OK(kvxfer_engine_info_get(p, &info));
    CHECK(info.pool_base == (uint64_t)(uintptr_t)pool, "pool base %llx", (unsigned long long)info.pool_base);
    CHECK(info.groups == 1 && info.tokens_per_block == 16 && info.parts == 2, "info");
    kvxfer_group_info gi, dgi;
    OK(kvxfer_engine_group(p, 0, &gi));
    OK(kvxfer_engine_group(d, 0, &dgi));
    CHECK(gi.block_bytes == 2 * 2 * 2 * 16 * 4 * 2, "block bytes %llu", (unsigned long long)gi.block_bytes);
    CHECK(kvxfer_engine_group(p, 5, &gi) == KVXFER_ERR_INVALID_ARGUMENT, "group 5");
    char ep[64];
    CHECK(kvxfer_node_endpoint(p, ep, sizeof ep) == KVXFER_ERR_INVALID_ARGUMENT, "endpoint of an in-process engine");
    CHECK(strstr(kvxfer_last_error(), "not a node"), "message: %s", kvxfer_last_error());

    const int prompt = 100, nblocks = 7; /* 100 tokens: 7 blocks of 16 */
    int32_t src[7];
    OK(kvxfer_blocks_alloc(p, 0, nblocks, src));
    for (int b = 0; b < nblocks; b++)
        for (uint64_t i = 0; i < gi.block_bytes; i++) pool[gi.offset + src[b] * gi.block_bytes + i] = pattern(1, b, i);

    kvxfer_request_t rx, tx;
    test_refused_requests(p, d);

    kvxfer_receive_request rr = {.id = "c-r1", .prompt_len = prompt, .context = "c-prefill", .user_data = 11};
    OK(kvxfer_receive(d, &rr, &rx));
    kvxfer_send_request sr = {.id = "c-r1", .prompt_len = prompt, .payload = "tok", .payload_len = 3, .user_data = 22};
    OK(kvxfer_send(p, &sr, &tx));

    /* A misaligned chunk is refused, naming it; nothing pinned, no fence. */
    kvxfer_block_run run = {.first = 0, .count = 2, .ids = src};
    kvxfer_fence_t f = 0;
    CHECK(kvxfer_chunk(tx, 0, 20, 0, &run, 1, &f) == KVXFER_ERR_BAD_CHUNK, "misaligned chunk");
    CHECK(strstr(kvxfer_last_error(), "20"), "message names the end: %s", kvxfer_last_error());
    CHECK(f == 0, "no fence for a refused chunk");
    CHECK(kvxfer_chunk(tx, 0, 32, 0, NULL, 1, &f) == KVXFER_ERR_INVALID_ARGUMENT, "NULL runs");
    CHECK(kvxfer_chunk(rx, 0, 32, 0, &run, 1, &f) == KVXFER_ERR_INVALID_ARGUMENT, "chunk on a receive");
    /* Wild counts are refused before anything is read or allocated from
     * them (before: an allocation of 2^32 runs aborted the process). */
    CHECK(kvxfer_chunk(tx, 0, 32, 0, &run, 0xFFFFFFFFu, &f) == KVXFER_ERR_INVALID_ARGUMENT, "groups 2^32-1");
    CHECK(strstr(kvxfer_last_error(), "groups = 4294967295"), "message names groups: %s", kvxfer_last_error());
    kvxfer_block_run wild = {.first = 0, .count = 0xFFFFFFFFu, .ids = src};
    CHECK(kvxfer_chunk(tx, 0, 32, 0, &wild, 1, &f) == KVXFER_ERR_INVALID_ARGUMENT, "count 2^32-1");
    CHECK(strstr(kvxfer_last_error(), "runs[0].count = 4294967295"), "message names the count: %s", kvxfer_last_error());
    CHECK(kvxfer_blocks_free(p, 0, src, 0xFFFFFFFFu) == KVXFER_ERR_INVALID_ARGUMENT, "free of 2^32-1 ids");
    kvxfer_request_t none = 0;
    CHECK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-wild", .prompt_len = 32, .context = "c-prefill",
                                                       .blocks = &run, .groups = 0xFFFFFFFFu}, &none) ==
              KVXFER_ERR_INVALID_ARGUMENT, "receive groups 2^32-1");
    CHECK(none == 0, "a refused receive returned a handle");

    /* A chunk behind a CUDA event: handle 0 is refused naming cu_event;
     * without a CUDA driver any handle is refused as unsupported, naming the
     * missing driver (the handle is never used). Both leave the request
     * going. Where a driver library loads, that half is skipped: the handle
     * here is no event, and test/gpu covers a real one. */
    CHECK(kvxfer_chunk_cuda(tx, 0, 32, 0, &run, 1, 0, 0) == KVXFER_ERR_INVALID_ARGUMENT, "cu_event 0");
    CHECK(strstr(kvxfer_last_error(), "cu_event"), "message names cu_event: %s", kvxfer_last_error());
    const char *libcuda = getenv("KVXFER_LIBCUDA");
    void *driver = dlopen(libcuda && *libcuda ? libcuda : "libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == NULL) {
        kvxfer_status cst = kvxfer_chunk_cuda(tx, 0, 32, 0, &run, 1, 0x1000, 0);
        CHECK(cst == KVXFER_ERR_UNSUPPORTED, "chunk_cuda without a CUDA driver returned %s", kvxfer_status_name(cst));
        CHECK(strstr(kvxfer_last_error(), "CUDA driver"), "message names the missing driver: %s", kvxfer_last_error());
        printf("ok   kvxfer_chunk_cuda without a CUDA driver: %s\n", kvxfer_last_error());
    } else {
        dlclose(driver);
        printf("skip kvxfer_chunk_cuda without a driver: a CUDA driver library loads here\n");
    }

    /* Two fenced chunks of 64 and 36 tokens. */
    run.count = 4;
    OK(kvxfer_chunk(tx, 0, 64, 0, &run, 1, &f));
    OK(kvxfer_fence_ready(f));
    CHECK(kvxfer_fence_ready(f) == KVXFER_ERR_BAD_HANDLE, "a fence fires once");
    kvxfer_block_run run2 = {.first = 4, .count = 3, .ids = src + 4};
    OK(kvxfer_chunk(tx, 64, 100, 1, &run2, 1, &f));
    /* The context side cannot finish while a fence is unfired. */
    CHECK(kvxfer_request_release(tx) == KVXFER_ERR_NOT_FINISHED, "release before the event");
    OK(kvxfer_fence_ready(f));

    kvxfer_event ev = wait_event(p, tx);
    CHECK(ev.outcome == KVXFER_OUTCOME_DONE && ev.error == KVXFER_OK && ev.user_data == 22, "tx outcome %d error %d",
          ev.outcome, ev.error);
    ev = wait_event(d, rx);
    CHECK(ev.outcome == KVXFER_OUTCOME_READY && ev.user_data == 11, "rx outcome %d error %d", ev.outcome, ev.error);
    CHECK(ev.bytes == (uint64_t)nblocks * gi.block_bytes, "rx bytes %llu", (unsigned long long)ev.bytes);

    int32_t dst[8];
    uint32_t n = 0;
    int32_t first = -1;
    CHECK(kvxfer_request_blocks(rx, 0, dst, 2, &n, &first) == KVXFER_ERR_BUFFER_TOO_SMALL && n == 7, "small buffer");
    OK(kvxfer_request_blocks(rx, 0, dst, 8, &n, &first));
    CHECK(n == 7 && first == 0, "n %u first %d", n, first);
    uint64_t checked = check_blocks(d, &dgi, dst, n, 1);
    char payload[8];
    OK(kvxfer_request_payload(rx, payload, sizeof payload, &n));
    CHECK(n == 3 && memcmp(payload, "tok", 3) == 0, "payload");
    OK(kvxfer_blocks_free(d, 0, dst, 7));
    OK(kvxfer_request_release(rx));
    OK(kvxfer_request_release(tx));
    CHECK(kvxfer_request_release(tx) == KVXFER_ERR_BAD_HANDLE, "double release");
    printf("ok   transfer: %llu bytes verified, payload delivered\n", (unsigned long long)checked);

    /* A failed fence fails the request on both sides. */
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-r2", .prompt_len = 32, .context = "c-prefill"}, &rx));
    OK(kvxfer_send(p, &(kvxfer_send_request){.id = "c-r2", .prompt_len = 32}, &tx));
    run.count = 2;
    OK(kvxfer_chunk(tx, 0, 32, 1, &run, 1, &f));
    OK(kvxfer_fence_fail(f, "cuda event error 700 \xe2\x80\x94 an illegal address"));
    ev = wait_event(p, tx);
    CHECK(ev.outcome == KVXFER_OUTCOME_FAILED && ev.error == KVXFER_ERR_FENCE, "failed fence: outcome %d error %s",
          ev.outcome, kvxfer_status_name(ev.error));
    char msg[512];
    OK(kvxfer_request_error(tx, msg, sizeof msg));
    CHECK(strstr(msg, "cuda event error 700"), "message carries the reason: %s", msg);
    /* A buffer that ends inside a character (the em dash's 3 bytes) gets
     * the message cut before that character: UTF-8 still. */
    const char *dash = strstr(msg, "\xe2\x80\x94");
    CHECK(dash, "message keeps the reason's em dash: %s", msg);
    size_t at = (size_t)(dash - msg);
    char cut[512];
    memset(cut, 'x', sizeof cut);
    OK(kvxfer_request_error(tx, cut, (uint32_t)at + 2)); /* room for the dash's first byte and the NUL */
    CHECK(strlen(cut) == at && strncmp(cut, msg, at) == 0, "truncated inside a character: %zu bytes (want %zu), last 0x%02x",
          strlen(cut), at, strlen(cut) ? (unsigned char)cut[strlen(cut) - 1] : 0);
    ev = wait_event(d, rx);
    CHECK(ev.outcome != KVXFER_OUTCOME_READY, "rx after a failed fence: %d", ev.outcome);
    OK(kvxfer_request_release(tx));
    OK(kvxfer_request_release(rx));
    printf("ok   failed fence: tx %s\n", kvxfer_status_name(KVXFER_ERR_FENCE));

    /* Cancel, delivered by callback. */
    OK(kvxfer_set_callback(d, on_event, &callback_events));
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-r3", .prompt_len = 32, .context = "c-prefill"}, &rx));
    OK(kvxfer_cancel(rx));
    double deadline = now() + 10;
    while (__atomic_load_n(&callback_events, __ATOMIC_SEQ_CST) == 0 && now() < deadline) {
        uint32_t got;
        kvxfer_event none[1];
        OK(kvxfer_poll(d, none, 1, &got, 10)); /* nothing queued while the callback is set */
        CHECK(got == 0, "an event went to the queue with a callback set");
    }
    CHECK(callback_events == 1, "callback events %d", callback_events);
    OK(kvxfer_request_error(rx, msg, sizeof msg));
    {
        /* A cancelled receive has no payload, as it has no blocks. */
        uint32_t pn = 99;
        kvxfer_status pst = kvxfer_request_payload(rx, NULL, 0, &pn);
        CHECK(pst == KVXFER_ERR_INVALID_ARGUMENT, "payload of a cancelled receive: %s", kvxfer_status_name(pst));
    }
    OK(kvxfer_request_release(rx));
    OK(kvxfer_set_callback(d, NULL, NULL));
    printf("ok   cancel via callback: %s\n", msg);

    OK(kvxfer_blocks_free(p, 0, src, nblocks));
    uint32_t used = 99;
    OK(kvxfer_blocks_used(p, 0, &used));
    CHECK(used == 0, "source pool used %u", used);
    OK(kvxfer_engine_close(p, 5000));
    OK(kvxfer_engine_close(d, 5000));
    CHECK(kvxfer_handle_count() == 0, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    free(pool);
    printf("ok   close: handle table empty\n");
}

/* Two engines for a layer-parts test: a prefill engine over a 1 MiB pool
 * the test owns (pool; land_and_close frees it) and a decode engine with
 * a pool of its own. */
struct pair {
    uint8_t *pool;
    kvxfer_engine_t p, d;
    kvxfer_group_info gi, dgi;
};

static struct pair open_pair(const char *prefill, const char *decode) {
    struct pair e = {.pool = aligned_alloc(4096, 1 << 20)};
    e.p = open_engine(prefill, e.pool, 1 << 20);
    e.d = open_engine(decode, NULL, 1 << 20);
    OK(kvxfer_engine_group(e.p, 0, &e.gi));
    OK(kvxfer_engine_group(e.d, 0, &e.dgi));
    return e;
}

/* Waits for tx's DONE of all nblocks blocks and rx's READY, checks every
 * byte of rx's blocks against request req's pattern, then frees and
 * releases everything and closes both engines; returns the bytes checked. */
static uint64_t land_and_close(struct pair *e, kvxfer_request_t tx, kvxfer_request_t rx, int32_t *src, uint32_t nblocks,
                               int req) {
    kvxfer_event ev = wait_event(e->p, tx);
    CHECK(ev.outcome == KVXFER_OUTCOME_DONE && ev.error == KVXFER_OK, "tx outcome %d error %d", ev.outcome, ev.error);
    CHECK(ev.bytes == (uint64_t)nblocks * e->gi.block_bytes, "tx bytes %llu", (unsigned long long)ev.bytes);
    ev = wait_event(e->d, rx);
    CHECK(ev.outcome == KVXFER_OUTCOME_READY, "rx outcome %d error %d", ev.outcome, ev.error);
    int32_t dst[16];
    uint32_t n = 0;
    int32_t first = -1;
    CHECK(nblocks <= 16, "%u blocks", nblocks);
    OK(kvxfer_request_blocks(rx, 0, dst, 16, &n, &first));
    CHECK(n == nblocks && first == 0, "n %u first %d", n, first);
    uint64_t checked = check_blocks(e->d, &e->dgi, dst, n, req);
    OK(kvxfer_request_free_blocks(rx));
    OK(kvxfer_request_release(rx));
    OK(kvxfer_request_release(tx));
    OK(kvxfer_blocks_free(e->p, 0, src, nblocks));
    OK(kvxfer_engine_close(e->p, 5000));
    OK(kvxfer_engine_close(e->d, 5000));
    CHECK(kvxfer_handle_count() == 0, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    free(e->pool);
    return checked;
}

/* A chunk's KV handed layer by layer (kvxfer_chunk_layers), as vLLM's
 * save_kv_layer produces it: each part fenced and its layer written only
 * after it was handed; bad layers and a part out of order are refused
 * naming the layers, and the request goes on; one chunk goes whole
 * (0, 0, 0). Every byte of every layer arrives. */
static void test_layer_parts(void) {
    struct pair e = open_pair("c-lp-prefill", "c-lp-decode");
    kvxfer_engine_t p = e.p, d = e.d;
    kvxfer_group_info gi = e.gi;
    uint8_t *pool = e.pool;
    const int layers = 2, prompt = 80, nblocks = 5; /* chunks [0,32) [32,64) [64,80) */
    const uint64_t per = gi.block_bytes / layers;   /* a block is ordered layer first */
    int32_t src[5];
    OK(kvxfer_blocks_alloc(p, 0, nblocks, src));
    memset(pool + gi.offset, 0, nblocks * gi.block_bytes);
    kvxfer_request_t rx, tx;
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-lp", .prompt_len = prompt, .context = "c-lp-prefill"}, &rx));
    OK(kvxfer_send(p, &(kvxfer_send_request){.id = "c-lp", .prompt_len = prompt}, &tx));

    kvxfer_block_run run = {.first = 0, .count = 2, .ids = src};
    kvxfer_fence_t f = 0;
    uint64_t handles = kvxfer_handle_count();
    CHECK(kvxfer_chunk_layers(tx, 0, 32, 0, 0, 1, 8, &run, 1, &f) == KVXFER_ERR_BAD_CHUNK, "layers of 8");
    CHECK(strstr(kvxfer_last_error(), "layers [0, 1) of 8"), "message names the layers: %s", kvxfer_last_error());
    CHECK(kvxfer_chunk_layers(tx, 0, 32, 0, -1, 1, 2, &run, 1, &f) == KVXFER_ERR_BAD_CHUNK, "negative layer");
    CHECK(kvxfer_chunk_layers(tx, 0, 32, 0, 1, 1, 2, &run, 1, &f) == KVXFER_ERR_BAD_CHUNK, "empty part");
    CHECK(kvxfer_chunk_layers_cuda(tx, 0, 32, 0, 0, 3, 2, &run, 1, 0x1000, 0) == KVXFER_ERR_BAD_CHUNK,
          "cuda part past the model: %s", kvxfer_last_error());
    CHECK(strstr(kvxfer_last_error(), "layers [0, 3) of 2"), "message names the layers: %s", kvxfer_last_error());
    CHECK(kvxfer_chunk_layers(tx, 0, 32, 0, 1, 2, 2, &run, 1, &f) == KVXFER_ERR_BAD_CHUNK, "first part at layer 1");
    CHECK(strstr(kvxfer_last_error(), "starts at layer 0"), "message: %s", kvxfer_last_error());
    CHECK(f == 0 && kvxfer_handle_count() == handles, "a refused part made a fence");

    struct {
        int start, end, lo, hi, of;
    } parts[] = {{0, 32, 0, 1, 2}, {0, 32, 1, 2, 2}, {32, 64, 0, 0, 0}, {64, 80, 0, 1, 2}, {64, 80, 1, 2, 2}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        int b0 = parts[k].start / 16, b1 = (parts[k].end + 15) / 16;
        run = (kvxfer_block_run){.first = b0, .count = b1 - b0, .ids = src + b0};
        if (k == 3) { /* the last chunk's second part before its first: refused */
            CHECK(kvxfer_chunk_layers(tx, 64, 80, 1, 1, 2, 2, &run, 1, &f) == KVXFER_ERR_BAD_CHUNK, "out of order");
            CHECK(strstr(kvxfer_last_error(), "layers [1, 2) of 2"), "message names the part: %s", kvxfer_last_error());
        }
        OK(kvxfer_chunk_layers(tx, parts[k].start, parts[k].end, parts[k].end == prompt, parts[k].lo, parts[k].hi,
                               parts[k].of, &run, 1, &f));
        int lo = parts[k].of ? parts[k].lo : 0, hi = parts[k].of ? parts[k].hi : layers;
        for (int b = b0; b < b1; b++)
            for (int l = lo; l < hi; l++)
                for (uint64_t i = 0; i < per; i++)
                    pool[gi.offset + src[b] * gi.block_bytes + l * per + i] = pattern(2, b, l * per + i);
        OK(kvxfer_fence_ready(f));
    }
    uint64_t checked = land_and_close(&e, tx, rx, src, nblocks, 2);
    printf("ok   layer parts: %llu bytes verified, bad and out-of-order parts refused\n", (unsigned long long)checked);
}

/* The driver entry points test_layer_parts_cuda uses (on a real driver and
 * on cuda/cudatest's fake alike). */
struct cu {
    void *lib;
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*ctx_retain)(void **, int);
    int (*ctx_release)(int);
    int (*ctx_set)(void *);
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*event_create)(void **, unsigned);
    int (*event_destroy)(void *);
    int (*event_record)(void *, void *);
    int (*mem_alloc)(uint64_t *, size_t);
    int (*mem_free)(uint64_t);
    int (*htod)(uint64_t, const void *, size_t, void *);
    int (*dtoh)(void *, uint64_t, size_t, void *);
};

/* Loads the driver (KVXFER_LIBCUDA, else libcuda.so.1) and makes device 0's
 * primary context current; returns 0 where there is no driver or device. */
static int open_cuda(struct cu *cu) {
    const char *path = getenv("KVXFER_LIBCUDA");
    cu->lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cu->lib == NULL) return 0;
#define SYM(f, name) CHECK((*(void **)&cu->f = dlsym(cu->lib, name)) != NULL, "the driver lacks %s", name)
    SYM(init, "cuInit");
    SYM(device_get, "cuDeviceGet");
    SYM(ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_release, "cuDevicePrimaryCtxRelease_v2");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(stream_create, "cuStreamCreate");
    SYM(stream_destroy, "cuStreamDestroy_v2");
    SYM(stream_sync, "cuStreamSynchronize");
    SYM(event_create, "cuEventCreate");
    SYM(event_destroy, "cuEventDestroy_v2");
    SYM(event_record, "cuEventRecord");
    SYM(mem_alloc, "cuMemAlloc_v2");
    SYM(mem_free, "cuMemFree_v2");
    SYM(htod, "cuMemcpyHtoDAsync_v2");
    SYM(dtoh, "cuMemcpyDtoHAsync_v2");
#undef SYM
    int dev = 0;
    void *ctx = NULL;
    if (cu->init(0) != 0 || cu->device_get(&dev, 0) != 0) {
        dlclose(cu->lib);
        return 0;
    }
    CHECK(cu->ctx_retain(&ctx, dev) == 0 && cu->ctx_set(ctx) == 0, "device 0's primary context");
    return 1;
}

/* Layer parts behind CUDA events (kvxfer_chunk_layers_cuda), where a driver
 * with a device loads: make ctest runs this program a second time on
 * cuda/cudatest's fake driver, each stream copy delayed so that every event
 * is still pending when its part is handed over. Each layer of each chunk
 * reaches the pool by a device-to-host copy on one stream, then its event is
 * recorded and the part handed over: a part read before its event completed
 * would carry zeros, and every byte is checked at the receiver. */
static void test_layer_parts_cuda(void) {
    struct cu cu;
    if (!open_cuda(&cu)) {
        printf("skip layer parts behind CUDA events: no CUDA driver with a device here\n");
        return;
    }
    struct pair e = open_pair("c-lpc-prefill", "c-lpc-decode");
    kvxfer_engine_t p = e.p, d = e.d;
    kvxfer_group_info gi = e.gi;
    uint8_t *pool = e.pool;
    enum { layers = 2, prompt = 64, nblocks = 4, req = 3 }; /* chunks [0,32) [32,64) */
    const uint64_t bb = gi.block_bytes, per = bb / layers, total = nblocks * bb;
    int32_t src[nblocks];
    OK(kvxfer_blocks_alloc(p, 0, nblocks, src));
    for (int b = 0; b < nblocks; b++) memset(pool + gi.offset + src[b] * bb, 0, bb);
    /* What the "model" computed, on the device: block b of the request. */
    uint8_t *host = malloc(total);
    for (uint64_t i = 0; i < total; i++) host[i] = pattern(req, i / bb, i % bb);
    void *stream = NULL;
    uint64_t stage = 0;
    CHECK(cu.stream_create(&stream, 0) == 0, "cuStreamCreate");
    CHECK(cu.mem_alloc(&stage, total) == 0, "cuMemAlloc");
    CHECK(cu.htod(stage, host, total, stream) == 0 && cu.stream_sync(stream) == 0, "staging copy");

    kvxfer_request_t rx, tx;
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-lpc", .prompt_len = prompt, .context = "c-lpc-prefill"}, &rx));
    OK(kvxfer_send(p, &(kvxfer_send_request){.id = "c-lpc", .prompt_len = prompt}, &tx));
    void *events[4];
    int k = 0;
    for (int start = 0; start < prompt; start += 32) {
        int b0 = start / 16, b1 = (start + 32) / 16;
        kvxfer_block_run run = {.first = b0, .count = b1 - b0, .ids = src + b0};
        for (int l = 0; l < layers; l++, k++) {
            for (int b = b0; b < b1; b++)
                CHECK(cu.dtoh(pool + gi.offset + src[b] * bb + l * per, stage + b * bb + l * per, per, stream) == 0,
                      "layer %d of block %d", l, b);
            CHECK(cu.event_create(&events[k], 0) == 0 && cu.event_record(events[k], stream) == 0, "event %d", k);
            OK(kvxfer_chunk_layers_cuda(tx, start, start + 32, start + 32 == prompt, l, l + 1, layers, &run, 1,
                                        (uint64_t)(uintptr_t)events[k], 0));
        }
    }
    uint64_t checked = land_and_close(&e, tx, rx, src, nblocks, req);
    for (int i = 0; i < k; i++) CHECK(cu.event_destroy(events[i]) == 0, "event %d destroyed", i);
    CHECK(cu.mem_free(stage) == 0 && cu.stream_destroy(stream) == 0 && cu.ctx_release(0) == 0, "driver cleanup");
    free(host);
    printf("ok   layer parts behind CUDA events: %llu bytes verified\n", (unsigned long long)checked);
}

/* MLA, context TP2, generation TP1: context TP rank 1 writes to no
 * generation rank. kvxfer_send_parallel, told the generation parallelism,
 * ends such a send DONE at once, holding nothing (kvxfer_send has no field
 * for it: that rank waited for a RequestData that never comes, its pins
 * held, and failed at its deadline). Bad values are refused, naming them. */
static void test_send_parallel_rank_without_peer(void) {
    const char *cfg =
        "{\"instance\":\"c-mla\",\"layout\":{\"layers\":2,\"kv_heads\":1,\"head_dim\":16,\"dtype_bytes\":2,"
        "\"tokens_per_block\":16,\"mla\":true},\"tp\":2,\"rank_tp\":1,\"pool_bytes\":65536,"
        "\"transfer_timeout_ms\":2000}";
    uint64_t handles = kvxfer_handle_count();
    kvxfer_engine_t e = 0;
    OK(kvxfer_engine_open(cfg, NULL, 0, &e));
    kvxfer_send_request sr = {.id = "c-mla", .prompt_len = 32, .user_data = 7};
    kvxfer_request_t tx = 0;
    struct {
        int32_t tp, pp;
        kvxfer_status want;
        const char *needle;
    } bad[] = {
        {-1, 1, KVXFER_ERR_INVALID_ARGUMENT, "generation_tp = -1, generation_pp = 1"},
        {1, -2, KVXFER_ERR_INVALID_ARGUMENT, "generation_tp = 1, generation_pp = -2"},
        {2, 0, KVXFER_ERR_INVALID_ARGUMENT, "generation_tp = 2, generation_pp = 0"},
        {0, 1, KVXFER_ERR_INVALID_ARGUMENT, "generation_tp = 0, generation_pp = 1"},
        {1, 3, KVXFER_ERR_BAD_REQUEST, "TP1/PP3"}, /* 3 pipeline stages of 2 layers */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvxfer_status st = kvxfer_send_parallel(e, &sr, bad[i].tp, bad[i].pp, &tx);
        CHECK(st == bad[i].want, "generation %d x %d returned %s", bad[i].tp, bad[i].pp, kvxfer_status_name(st));
        CHECK(strstr(kvxfer_last_error(), bad[i].needle), "message names the values: %s", kvxfer_last_error());
    }
    CHECK(tx == 0 && kvxfer_handle_count() == handles + 1, "a refused send left a handle");
    CHECK(kvxfer_send_parallel(e, NULL, 1, 1, &tx) == KVXFER_ERR_INVALID_ARGUMENT, "NULL req");
    CHECK(strstr(kvxfer_last_error(), "kvxfer_send_parallel: req"), "message: %s", kvxfer_last_error());

    int32_t src[2];
    OK(kvxfer_blocks_alloc(e, 0, 2, src));
    double t0 = now();
    OK(kvxfer_send_parallel(e, &sr, 1, 1, &tx));
    kvxfer_event ev = wait_event(e, tx);
    CHECK(ev.outcome == KVXFER_OUTCOME_DONE && ev.error == KVXFER_OK && ev.bytes == 0 && ev.user_data == 7,
          "outcome %d error %s bytes %llu after %.1f s, want DONE at once", ev.outcome, kvxfer_status_name(ev.error),
          (unsigned long long)ev.bytes, now() - t0);
    /* Its chunks are taken and go nowhere; nothing stays pinned. */
    kvxfer_block_run run = {.first = 0, .count = 2, .ids = src};
    OK(kvxfer_chunk(tx, 0, 32, 1, &run, 1, NULL));
    OK(kvxfer_request_release(tx));
    OK(kvxfer_blocks_free(e, 0, src, 2));
    uint32_t used = 99;
    OK(kvxfer_blocks_used(e, 0, &used));
    CHECK(used == 0, "blocks used %u", used);
    OK(kvxfer_engine_close(e, 5000));
    CHECK(kvxfer_handle_count() == handles, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   kvxfer_send_parallel: a rank with no generation peer is DONE in %.3f s; bad values named\n",
           now() - t0);
}

/* A receive's destination runs say which global block their first id
 * holds, and it must be the group's first needed block: here a full
 * attention group with 2 prefix-hit blocks (blocks [2, 7) of a 100-token
 * prompt) and a sliding-window group of 32 tokens (only [4, 7) are
 * resident). A run starting elsewhere is refused naming the group, its
 * first and the expected one (before: taken, and READY's ids held other
 * global blocks than the caller's run said); the right runs receive
 * exactly those blocks. */
static void test_receive_run_first(void) {
    const char *cfg =
        "{\"instance\":\"%s\",\"layout\":{\"layers\":2,\"kv_heads\":2,\"head_dim\":4,\"dtype_bytes\":2,"
        "\"tokens_per_block\":16,\"groups\":[{\"name\":\"full\",\"layers\":[0]},"
        "{\"name\":\"swa\",\"layers\":[1],\"window\":32}]},\"pool_bytes\":262144,\"transfer_timeout_ms\":10000}";
    char pc[512], dc[512];
    snprintf(pc, sizeof pc, cfg, "c-first-p");
    snprintf(dc, sizeof dc, cfg, "c-first-d");
    uint64_t handles = kvxfer_handle_count();
    kvxfer_engine_t p = 0, d = 0;
    OK(kvxfer_engine_open(pc, NULL, 0, &p));
    OK(kvxfer_engine_open(dc, NULL, 0, &d));
    enum { PROMPT = 100, NBLOCKS = 7 };
    const int32_t want_first[2] = {2, 4}, want_n[2] = {5, 3};
    int32_t hits[2] = {2, 0};

    /* Source: every block of both groups, each byte its group's pattern
     * of its global block. */
    kvxfer_engine_info pinfo;
    OK(kvxfer_engine_info_get(p, &pinfo));
    uint8_t *ppool = (uint8_t *)(uintptr_t)pinfo.pool_base;
    int32_t src[2][NBLOCKS];
    kvxfer_group_info pg[2], dg[2];
    for (int g = 0; g < 2; g++) {
        OK(kvxfer_engine_group(p, g, &pg[g]));
        OK(kvxfer_engine_group(d, g, &dg[g]));
        OK(kvxfer_blocks_alloc(p, g, NBLOCKS, src[g]));
        for (int b = 0; b < NBLOCKS; b++)
            for (uint64_t i = 0; i < pg[g].block_bytes; i++)
                ppool[pg[g].offset + src[g][b] * pg[g].block_bytes + i] = pattern(10 + g, b, i);
    }
    int32_t dst[2][5];
    OK(kvxfer_blocks_alloc(d, 0, want_n[0], dst[0]));
    OK(kvxfer_blocks_alloc(d, 1, want_n[1], dst[1]));

    kvxfer_block_run runs[2] = {{.first = 0, .count = 5, .ids = dst[0]}, {.first = 4, .count = 3, .ids = dst[1]}};
    kvxfer_receive_request rr = {.id = "c-first", .prompt_len = PROMPT, .context = "c-first-p", .blocks = runs,
                                 .groups = 2, .prefix_hit_blocks = hits};
    kvxfer_request_t rx = 0, tx = 0;
    struct {
        int32_t first0, first1;
        const char *needle;
    } bad[] = {
        {0, 4, "blocks[0].first = 0, want 2"}, /* the prefix hits not skipped */
        {2, 0, "blocks[1].first = 0, want 4"}, /* the window not applied */
        {2, 5, "blocks[1].first = 5, want 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        runs[0].first = bad[i].first0;
        runs[1].first = bad[i].first1;
        kvxfer_status st = kvxfer_receive(d, &rr, &rx);
        if (st == KVXFER_OK) { /* end it before failing, so the message is the one printed */
            kvxfer_cancel(rx);
            wait_event(d, rx);
            kvxfer_request_release(rx);
            rx = 0;
        }
        CHECK(st == KVXFER_ERR_INVALID_ARGUMENT, "runs first %d, %d for needed blocks [2, 7), [4, 7) returned %s",
              bad[i].first0, bad[i].first1, kvxfer_status_name(st));
        CHECK(strstr(kvxfer_last_error(), bad[i].needle) && strstr(kvxfer_last_error(), "layer group"),
              "message names the group, the first and the expected one: %s", kvxfer_last_error());
    }
    CHECK(rx == 0, "a refused receive returned a handle");

    runs[0].first = 2;
    runs[1].first = 4;
    OK(kvxfer_receive(d, &rr, &rx));
    OK(kvxfer_send_parallel(p, &(kvxfer_send_request){.id = "c-first", .prompt_len = PROMPT}, 1, 1, &tx));
    kvxfer_block_run sruns[2] = {{.first = 0, .count = NBLOCKS, .ids = src[0]},
                                 {.first = 0, .count = NBLOCKS, .ids = src[1]}};
    OK(kvxfer_chunk(tx, 0, PROMPT, 1, sruns, 2, NULL));
    kvxfer_event ev = wait_event(p, tx);
    CHECK(ev.outcome == KVXFER_OUTCOME_DONE, "tx outcome %d error %s", ev.outcome, kvxfer_status_name(ev.error));
    ev = wait_event(d, rx);
    CHECK(ev.outcome == KVXFER_OUTCOME_READY, "rx outcome %d error %s", ev.outcome, kvxfer_status_name(ev.error));
    kvxfer_engine_info dinfo;
    OK(kvxfer_engine_info_get(d, &dinfo));
    const uint8_t *dpool = (const uint8_t *)(uintptr_t)dinfo.pool_base;
    uint64_t checked = 0;
    for (int g = 0; g < 2; g++) {
        int32_t ids[8], first = -1;
        uint32_t n = 0;
        OK(kvxfer_request_blocks(rx, g, ids, 8, &n, &first));
        CHECK(first == want_first[g] && (int32_t)n == want_n[g] && memcmp(ids, dst[g], n * sizeof ids[0]) == 0,
              "group %d: first %d, %u blocks", g, first, n);
        for (uint32_t k = 0; k < n; k++)
            for (uint64_t i = 0; i < dg[g].block_bytes; i++, checked++)
                CHECK(dpool[dg[g].offset + ids[k] * dg[g].block_bytes + i] == pattern(10 + g, first + k, i),
                      "group %d global block %u byte %llu", g, first + k, (unsigned long long)i);
    }
    OK(kvxfer_request_release(rx));
    OK(kvxfer_request_release(tx));
    for (int g = 0; g < 2; g++) {
        OK(kvxfer_blocks_free(p, g, src[g], NBLOCKS));
        OK(kvxfer_blocks_free(d, g, dst[g], want_n[g]));
    }
    OK(kvxfer_engine_close(p, 5000));
    OK(kvxfer_engine_close(d, 5000));
    CHECK(kvxfer_handle_count() == handles, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   receive runs: a first off the needed blocks refused; prefix hits and a window: %llu bytes verified\n",
           (unsigned long long)checked);
}

/* The callback's user pointer is the caller's, opaque: a small integer
 * cast to void * (an index, a handle, what Python's ctypes passes for an
 * int) must reach the callback as given. The library once kept it as a Go
 * pointer, and a Go stack move while the callback was on its way aborted
 * the process ("invalid pointer found on stack"): rare in a plain build,
 * at once in `make ctest`'s second run, over a library that moves the
 * stack at every call. Each callback calls back into the library. */
static int small_user_events, small_user_wrong;
static void on_event_small_user(const kvxfer_event *ev, void *user) {
    if ((uintptr_t)user != 7) __atomic_add_fetch(&small_user_wrong, 1, __ATOMIC_SEQ_CST);
    char msg[128];
    kvxfer_request_error(ev->request, msg, sizeof msg);
    kvxfer_request_release(ev->request);
    __atomic_add_fetch(&small_user_events, 1, __ATOMIC_SEQ_CST);
}

static void test_callback_small_user(void) {
    kvxfer_engine_t d = open_engine("c-cb-decode", NULL, 1 << 20);
    OK(kvxfer_set_callback(d, on_event_small_user, (void *)(uintptr_t)7));
    const int n = 50;
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "c-cb-%d", i);
        kvxfer_request_t rx;
        OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = id, .prompt_len = 32, .context = "c-cb-nobody"}, &rx));
        OK(kvxfer_cancel(rx));
    }
    double deadline = now() + 10;
    while (__atomic_load_n(&small_user_events, __ATOMIC_SEQ_CST) < n && now() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(small_user_events == n, "callback events %d of %d", small_user_events, n);
    CHECK(small_user_wrong == 0, "%d callbacks got another user pointer than 7", small_user_wrong);
    OK(kvxfer_engine_close(d, 5000));
    CHECK(kvxfer_handle_count() == 0, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   callback with a small integer as user: %d events\n", n);
}

/* kvxfer_engine_close from the engine's own callback waits for every
 * callback under way, that one too: it hung for good. It is refused
 * (KVXFER_ERR_INVALID_ARGUMENT, the message saying so) and closes nothing;
 * a close of another engine from the callback still closes it. */
static struct {
    kvxfer_engine_t self, other;
    kvxfer_status self_st, other_st;
    char msg[1024];
    int done;
} close_cb;
static void on_event_close(const kvxfer_event *ev, void *user) {
    (void)ev;
    (void)user;
    if (__atomic_load_n(&close_cb.done, __ATOMIC_SEQ_CST)) return;
    close_cb.self_st = kvxfer_engine_close(close_cb.self, 1000);
    snprintf(close_cb.msg, sizeof close_cb.msg, "%s", kvxfer_last_error());
    close_cb.other_st = kvxfer_engine_close(close_cb.other, 1000);
    __atomic_store_n(&close_cb.done, 1, __ATOMIC_SEQ_CST);
}

static void test_close_from_own_callback(void) {
    uint64_t handles = kvxfer_handle_count();
    kvxfer_engine_t d = open_engine("c-cbclose-decode", NULL, 1 << 20);
    close_cb.self = d;
    close_cb.other = open_engine("c-cbclose-other", NULL, 1 << 20);
    OK(kvxfer_set_callback(d, on_event_close, NULL));
    kvxfer_request_t rx;
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-cbclose", .prompt_len = 32, .context = "c-cbclose-nobody"},
                      &rx));
    OK(kvxfer_cancel(rx));
    double deadline = now() + 10;
    while (!__atomic_load_n(&close_cb.done, __ATOMIC_SEQ_CST) && now() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(__atomic_load_n(&close_cb.done, __ATOMIC_SEQ_CST), "the callback's kvxfer_engine_close did not return in 10 s");
    CHECK(close_cb.self_st == KVXFER_ERR_INVALID_ARGUMENT, "close from its own callback returned %s",
          kvxfer_status_name(close_cb.self_st));
    CHECK(strstr(close_cb.msg, "own callback") && strstr(close_cb.msg, "another thread"),
          "message names the misuse and what to do: %s", close_cb.msg);
    CHECK(close_cb.other_st == KVXFER_OK, "close of another engine from the callback returned %s",
          kvxfer_status_name(close_cb.other_st));
    /* Nothing of d was closed or released: its request is there, finished. */
    kvxfer_engine_info info;
    OK(kvxfer_engine_info_get(d, &info));
    char msg[256];
    OK(kvxfer_request_error(rx, msg, sizeof msg));
    OK(kvxfer_request_release(rx));
    OK(kvxfer_engine_close(d, 5000));
    CHECK(kvxfer_handle_count() == handles, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   kvxfer_engine_close from its own callback refused: %s\n", close_cb.msg);
}

/* A message over the thread's 1023 bytes is cut there, before a
 * character, never inside one. Config values are clipped to 64 bytes
 * now, so no config error reaches the cut; a node's wait for silent
 * peers names each of them, and with ten peers of 61-character names
 * (122 bytes of UTF-8, mostly 2-byte characters) the message is over
 * 1400 bytes. Run with the names shifted by one byte (a leading "x") so
 * that the cut falls at either offset of a 2-byte character wherever it
 * lands in the names. */
static void test_last_error_cut(void) {
    for (int shift = 0; shift < 2; shift++) {
        char cfg[4096];
        int k = snprintf(cfg, sizeof cfg,
                         "{\"instance\":\"c-cut-%d\",\"model\":\"Llama-3.1-8B\",\"tokens_per_block\":16,"
                         "\"pool_bytes\":4194304,\"backend\":\"loopback\",\"workers\":2,"
                         "\"bind\":\"tcp://127.0.0.1:0\",\"insecure\":true,\"peers\":[",
                         shift);
        for (int p = 0; p < 10; p++) {
            k += snprintf(cfg + k, sizeof cfg - k, "%s{\"instance\":\"%s", p ? "," : "", shift ? "x" : "");
            for (int i = 0; i < 60; i++) k += snprintf(cfg + k, sizeof cfg - k, "\xc3\xa9");
            k += snprintf(cfg + k, sizeof cfg - k, "%d\",\"endpoint\":\"tcp://127.0.0.1:1\"}", p);
        }
        snprintf(cfg + k, sizeof cfg - k, "]}");
        CHECK(k < (int)sizeof cfg - 8, "config of %d bytes", k);
        kvxfer_engine_t n = 0;
        OK(kvxfer_node_open(cfg, &n));
        CHECK(kvxfer_node_wait_peers(n, 0) == KVXFER_ERR_TIMEOUT, "wait for ten silent peers");
        const char *m = kvxfer_last_error();
        size_t len = strlen(m);
        /* Cut at 1023 bytes, less at most the 3 bytes of a character it
         * would split: the message is longer than the buffer. */
        CHECK(len <= 1023 && len >= 1020 && utf8_valid(m) && strstr(m, "said nothing") && strstr(m, "0/0 at tcp://127.0.0.1:1"),
              "a message over 1023 bytes (shift %d): %zu bytes, valid UTF-8 %d", shift, len, utf8_valid(m));
        printf("ok   kvxfer_last_error cut a long message at %zu bytes (shift %d)\n", len, shift);
        OK(kvxfer_engine_close(n, 5000));
    }
}

/* A string out of the library into (NULL, 0) asks for its size: a
 * count-0 array is never read, so the answer is KVXFER_ERR_BUFFER_TOO_SMALL
 * naming the bytes needed, as for any buffer too small (it was
 * KVXFER_ERR_INVALID_ARGUMENT, "buf is NULL"); a buffer of that size then
 * takes it. */
static void test_size_query(void) {
    const char *cfg = "{\"instance\":\"c-size\",\"model\":\"Llama-3.1-8B\",\"tokens_per_block\":16,"
                      "\"pool_bytes\":4194304,\"backend\":\"loopback\",\"workers\":2,"
                      "\"bind\":\"tcp://127.0.0.1:0\",\"insecure\":true}";
    kvxfer_engine_t n = 0;
    OK(kvxfer_node_open(cfg, &n));
    CHECK(kvxfer_node_endpoint(n, NULL, 0) == KVXFER_ERR_BUFFER_TOO_SMALL, "endpoint into (NULL, 0)");
    unsigned need = 0;
    const char *m = strstr(kvxfer_last_error(), "kvxfer_node_endpoint: ");
    CHECK(m && sscanf(m, "kvxfer_node_endpoint: %u bytes needed", &need) == 1 && need > 16 && need < 64,
          "the size needed named: %s", kvxfer_last_error());
    char ep[64];
    OK(kvxfer_node_endpoint(n, ep, need));
    CHECK(strlen(ep) + 1 == need && strncmp(ep, "tcp://127.0.0.1:", 16) == 0, "endpoint %s in %u bytes", ep, need);
    CHECK(kvxfer_node_endpoint(n, NULL, need) == KVXFER_ERR_INVALID_ARGUMENT, "endpoint into NULL of %u bytes", need);
    CHECK(kvxfer_node_public_key(n, NULL, 0) == KVXFER_ERR_BUFFER_TOO_SMALL && strstr(kvxfer_last_error(), "1 bytes needed"),
          "an insecure node's public key (\"\") into (NULL, 0): %s", kvxfer_last_error());
    printf("ok   (NULL, 0) asks for a string's size: %u bytes for %s\n", need, ep);
    OK(kvxfer_engine_close(n, 5000));
}

/* An empty array may come with any pointer: Rust's empty slice is a
 * dangling non-NULL pointer (its alignment, 0x4 for int32_t), and other
 * bindings do the like. With a count of 0 the library must never hold it
 * as a Go pointer: it did, and a Go stack move during the call aborted the
 * process ("invalid pointer found on stack"), at once in `make ctest`'s
 * run over a library that moves the stack at every call. Each call below
 * takes such a pointer with a count of 0, and the request goes through:
 * the empty array is handled as an empty one (receive blocks as NULL: the
 * engine allocates). */
static void test_empty_dangling(void) {
    void *D = (void *)(uintptr_t)4;
    kvxfer_engine_t p = open_engine("c-dangle-prefill", NULL, 1 << 20);
    kvxfer_engine_t d = open_engine("c-dangle-decode", NULL, 1 << 20);
    uint32_t got = 99, used = 99;
    OK(kvxfer_blocks_alloc(p, 0, 0, (int32_t *)D));
    OK(kvxfer_blocks_free(p, 0, (const int32_t *)D, 0));
    OK(kvxfer_blocks_used(p, 0, &used));
    CHECK(used == 0, "used %u after an empty alloc and free", used);
    OK(kvxfer_poll(p, (kvxfer_event *)D, 0, &got, 0));
    CHECK(got == 0, "poll of 0 events got %u", got);
    CHECK(kvxfer_node_endpoint(p, (char *)D, 0) == KVXFER_ERR_INVALID_ARGUMENT, "endpoint into cap 0");
    CHECK(kvxfer_node_public_key(p, (char *)D, 0) == KVXFER_ERR_INVALID_ARGUMENT, "public key into cap 0");

    kvxfer_request_t rx = 0, tx = 0;
    OK(kvxfer_send(p, &(kvxfer_send_request){.id = "c-dangle", .prompt_len = 32, .payload = D, .payload_len = 0}, &tx));
    OK(kvxfer_request_set_payload(tx, D, 0));
    /* Chunks naming no run, or an empty run, are refused; the request goes on. */
    kvxfer_block_run empty = {.first = 0, .count = 0, .ids = D};
    kvxfer_status st[] = {
        kvxfer_chunk(tx, 0, 32, 1, D, 0, NULL),
        kvxfer_chunk(tx, 0, 32, 1, &empty, 1, NULL),
        kvxfer_chunk_layers(tx, 0, 32, 1, 0, 1, 2, D, 0, NULL),
        kvxfer_chunk_layers(tx, 0, 32, 1, 0, 1, 2, &empty, 1, NULL),
        kvxfer_chunk_cuda(tx, 0, 32, 1, D, 0, 0, 0),
        kvxfer_chunk_layers_cuda(tx, 0, 32, 1, 0, 1, 2, &empty, 1, 0, 0),
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        CHECK(st[i] != KVXFER_OK, "empty chunk %zu was taken", i);
    /* blocks with groups 0 is NULL: the engine allocates (it was refused,
     * "destination blocks for 0 layer groups"). */
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-dangle", .prompt_len = 32, .context = "c-dangle-prefill",
                                                    .blocks = D, .groups = 0, .prefix_hit_blocks = D}, &rx));
    int32_t src[2];
    OK(kvxfer_blocks_alloc(p, 0, 2, src));
    OK(kvxfer_chunk(tx, 0, 32, 1, &(kvxfer_block_run){.first = 0, .count = 2, .ids = src}, 1, NULL));
    kvxfer_event ev = wait_event(p, tx);
    CHECK(ev.outcome == KVXFER_OUTCOME_DONE, "tx outcome %d error %s", ev.outcome, kvxfer_status_name(ev.error));
    ev = wait_event(d, rx);
    CHECK(ev.outcome == KVXFER_OUTCOME_READY, "rx outcome %d error %s", ev.outcome, kvxfer_status_name(ev.error));
    uint32_t n = 99;
    int32_t first = -1;
    CHECK(kvxfer_request_blocks(rx, 0, (int32_t *)D, 0, &n, &first) == KVXFER_ERR_BUFFER_TOO_SMALL && n == 2,
          "blocks into cap 0: n %u", n);
    n = 99;
    OK(kvxfer_request_payload(rx, D, 0, &n));
    CHECK(n == 0, "empty payload: n %u", n);
    CHECK(kvxfer_request_error(rx, (char *)D, 0) == KVXFER_ERR_INVALID_ARGUMENT, "error into cap 0");
    CHECK(strstr(kvxfer_last_error(), "cap is 0") && !strstr(kvxfer_last_error(), "NULL"),
          "error into cap 0 names the cap, not a NULL buf: %s", kvxfer_last_error());
    OK(kvxfer_request_free_blocks(rx)); /* the engine's blocks: blocks = D, groups = 0 was NULL */
    OK(kvxfer_request_release(rx));
    OK(kvxfer_request_release(tx));
    OK(kvxfer_blocks_free(p, 0, src, 2));
    OK(kvxfer_engine_close(p, 5000));
    OK(kvxfer_engine_close(d, 5000));
    CHECK(kvxfer_handle_count() == 0, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   empty arrays behind a dangling pointer (0x4) with count 0\n");
}

/* kvxfer_engine_stats keeps its layout (kvxfer.h: a counter added later
 * goes in kvxfer_engine_stats_ext): every field at the offset the ABI
 * fixed. */
#define STATS_AT(field, i) \
    _Static_assert(offsetof(kvxfer_engine_stats, field) == 8 * (i), "kvxfer_engine_stats." #field " moved")
STATS_AT(ops_posted, 0);
STATS_AT(worker_restarts, 1);
STATS_AT(frames_unsent, 2);
STATS_AT(frames_rejected, 3);
STATS_AT(frames_stale, 4);
STATS_AT(frames_shed, 5);
STATS_AT(cancels_deferred, 6);
STATS_AT(session_panics, 7);
STATS_AT(session_panics_past_budget, 8);
STATS_AT(parent_panics, 9);
STATS_AT(pin_errors, 10);
STATS_AT(leases_lapsed, 11);
STATS_AT(stream_violations, 12);
STATS_AT(blocks_revoked, 13);
STATS_AT(revoked_held_blocks, 14);
STATS_AT(caller_blocks_awaiting_proof, 15);
STATS_AT(dest_block_errors, 16);
STATS_AT(quarantined_bytes, 17);
STATS_AT(quarantine_limit_bytes, 18);
STATS_AT(closes_unproven, 19);
STATS_AT(frames_silenced, 20);
STATS_AT(waiting_for_blocks, 21);
STATS_AT(orphan_requests, 22);
STATS_AT(orphans_ended, 23);
STATS_AT(write_proofs_exited, 24);
STATS_AT(write_proof_requests_exited, 25);
STATS_AT(write_proofs_pidfd_exit, 26);
STATS_AT(write_proof_requests_pidfd_exit, 27);
STATS_AT(write_proofs_drained_goodbye, 28);
STATS_AT(write_proof_requests_drained_goodbye, 29);
_Static_assert(sizeof(kvxfer_engine_stats) == 240, "kvxfer_engine_stats changed size");
/* kvxfer_engine_stats_ext only grows at its end: the fields of each minor
 * where that minor put them. */
#define STATS_EXT_AT(field, i) \
    _Static_assert(offsetof(kvxfer_engine_stats_ext, field) == 8 * (i), "kvxfer_engine_stats_ext." #field " moved")
STATS_EXT_AT(ops_in_doubt, 0); /* minor 11 */
_Static_assert(sizeof(kvxfer_engine_stats_ext) == 8, "kvxfer_engine_stats_ext: a field added without its STATS_EXT_AT");

/* Polls engine e's stats until ok(stats) (10 s deadline). */
static kvxfer_engine_stats wait_stats(kvxfer_engine_t e, int (*ok)(const kvxfer_engine_stats *), const char *what) {
    kvxfer_engine_stats s;
    double deadline = now() + 10;
    for (;;) {
        OK(kvxfer_engine_stats_get(e, &s));
        if (ok(&s)) return s;
        CHECK(now() < deadline, "no %s in 10 s: orphan_requests %lld, orphans_ended %lld", what,
              (long long)s.orphan_requests, (long long)s.orphans_ended);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL); /* poll with a deadline */
    }
}

static int one_orphan(const kvxfer_engine_stats *s) { return s->orphan_requests == 1; }
static int orphan_ended(const kvxfer_engine_stats *s) { return s->orphans_ended == 1 && s->orphan_requests == 0; }

/* kvxfer_engine_stats_ext_get on engine p, fresh: the same counters as
 * kvxfer_engine_stats_get and none in doubt; a caller whose header is
 * newer than the library (a longer struct) gets the library's fields
 * written, the rest left as they were, and *written says how many bytes;
 * a size that is no positive multiple of 8, or a NULL struct, is named. */
static void test_stats_ext(kvxfer_engine_t p) {
    kvxfer_engine_stats s, base;
    struct {
        kvxfer_engine_stats_ext ext;
        int64_t later; /* a counter of a minor after this library's */
    } big;
    memset(&s, 0xff, sizeof s);
    memset(&big, 0xff, sizeof big);
    size_t written = 0;
    OK(kvxfer_engine_stats_ext_get(p, &s, &big.ext, sizeof big, &written));
    OK(kvxfer_engine_stats_get(p, &base));
    CHECK(written == sizeof(kvxfer_engine_stats_ext), "written %zu of %zu bytes, want %zu", written, sizeof big,
          sizeof(kvxfer_engine_stats_ext));
    CHECK(big.ext.ops_in_doubt == 0, "a fresh engine has %lld ops in doubt", (long long)big.ext.ops_in_doubt);
    CHECK(big.later == -1, "a field past *written was written: %lld", (long long)big.later);
    CHECK(memcmp(&s, &base, sizeof s) == 0, "kvxfer_engine_stats_ext_get's *out differs from kvxfer_engine_stats_get's");
    kvxfer_engine_stats_ext ext;
    OK(kvxfer_engine_stats_ext_get(p, &s, &ext, sizeof ext, NULL)); /* written may be NULL */
    size_t bad[] = {0, 4, 12};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(kvxfer_engine_stats_ext_get(p, &s, &ext, bad[i], &written) == KVXFER_ERR_INVALID_ARGUMENT,
              "size %zu taken", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "size = %zu bytes", bad[i]);
        CHECK(strstr(kvxfer_last_error(), want) && strstr(kvxfer_last_error(), "sizeof(kvxfer_engine_stats_ext)"),
              "message names the size and what to pass: %s", kvxfer_last_error());
    }
    CHECK(kvxfer_engine_stats_ext_get(p, &s, NULL, sizeof ext, NULL) == KVXFER_ERR_INVALID_ARGUMENT, "ext NULL");
    CHECK(strstr(kvxfer_last_error(), "kvxfer_engine_stats_ext_get") && strstr(kvxfer_last_error(), "ext"),
          "message names the call and the argument: %s", kvxfer_last_error());
    CHECK(kvxfer_engine_stats_ext_get(p, NULL, &ext, sizeof ext, NULL) == KVXFER_ERR_INVALID_ARGUMENT, "out NULL");
    CHECK(kvxfer_engine_stats_ext_get(777777, &s, &ext, sizeof ext, NULL) == KVXFER_ERR_BAD_HANDLE,
          "ext stats of a bad handle");
}

/* kvxfer_engine_stats_get: a fresh engine counts nothing (the quarantine
 * bound aside); a receive whose context engine has no send of it is an
 * orphan there (orphan_requests, at offset 176), which ends when the
 * receive is cancelled (orphans_ended), and a transfer posts ops. Bad
 * arguments are named. */
static void test_stats(void) {
    kvxfer_engine_t p = open_engine("c-stats-prefill", NULL, 1 << 20);
    kvxfer_engine_t d = open_engine("c-stats-decode", NULL, 1 << 20);
    kvxfer_engine_stats s;
    memset(&s, 0xff, sizeof s);
    OK(kvxfer_engine_stats_get(p, &s));
    const int64_t *v = (const int64_t *)&s;
    for (size_t i = 0; i < sizeof s / 8; i++)
        CHECK(v[i] == 0 || i == offsetof(kvxfer_engine_stats, quarantine_limit_bytes) / 8,
              "field %zu of a fresh engine's stats is %lld", i, (long long)v[i]);
    CHECK(kvxfer_engine_stats_get(p, NULL) == KVXFER_ERR_INVALID_ARGUMENT, "stats into NULL");
    CHECK(strstr(kvxfer_last_error(), "kvxfer_engine_stats_get") && strstr(kvxfer_last_error(), "out"),
          "message names the call and the argument: %s", kvxfer_last_error());
    CHECK(kvxfer_engine_stats_get(777777, &s) == KVXFER_ERR_BAD_HANDLE, "stats of a bad handle");
    CHECK(strstr(kvxfer_last_error(), "777777"), "message names the handle: %s", kvxfer_last_error());
    test_stats_ext(p);

    kvxfer_request_t rx = 0, tx = 0;
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-orphan", .prompt_len = 32, .context = "c-stats-prefill"},
                      &rx));
    wait_stats(p, one_orphan, "orphan at the context engine");
    OK(kvxfer_cancel(rx));
    kvxfer_event ev = wait_event(d, rx);
    CHECK(ev.outcome == KVXFER_OUTCOME_CANCELLED, "rx outcome %d", ev.outcome);
    OK(kvxfer_request_release(rx));
    wait_stats(p, orphan_ended, "orphan ended at the context engine");

    int32_t src[2];
    OK(kvxfer_blocks_alloc(p, 0, 2, src));
    OK(kvxfer_receive(d, &(kvxfer_receive_request){.id = "c-stats", .prompt_len = 32, .context = "c-stats-prefill"},
                      &rx));
    OK(kvxfer_send(p, &(kvxfer_send_request){.id = "c-stats", .prompt_len = 32}, &tx));
    OK(kvxfer_chunk(tx, 0, 32, 1, &(kvxfer_block_run){.first = 0, .count = 2, .ids = src}, 1, NULL));
    CHECK(wait_event(p, tx).outcome == KVXFER_OUTCOME_DONE, "tx not DONE");
    CHECK(wait_event(d, rx).outcome == KVXFER_OUTCOME_READY, "rx not READY");
    OK(kvxfer_request_free_blocks(rx));
    OK(kvxfer_request_release(rx));
    OK(kvxfer_request_release(tx));
    OK(kvxfer_blocks_free(p, 0, src, 2));
    OK(kvxfer_engine_stats_get(p, &s));
    CHECK(s.ops_posted > 0 && s.frames_rejected == 0 && s.frames_stale == 0 && s.parent_panics == 0 &&
              s.quarantined_bytes == 0 && s.orphans_ended == 1,
          "after a transfer: ops_posted %lld, frames_rejected %lld, frames_stale %lld, orphans_ended %lld",
          (long long)s.ops_posted, (long long)s.frames_rejected, (long long)s.frames_stale, (long long)s.orphans_ended);
    kvxfer_engine_stats_ext ext;
    OK(kvxfer_engine_stats_ext_get(p, &s, &ext, sizeof ext, NULL));
    CHECK(ext.ops_in_doubt == 0, "%lld ops in doubt after a transfer", (long long)ext.ops_in_doubt);
    OK(kvxfer_engine_close(p, 5000));
    OK(kvxfer_engine_close(d, 5000));
    CHECK(kvxfer_engine_stats_get(p, &s) == KVXFER_ERR_BAD_HANDLE, "stats of a closed engine");
    CHECK(kvxfer_handle_count() == 0, "handles left: %llu", (unsigned long long)kvxfer_handle_count());
    printf("ok   engine stats: orphans counted and ended, %lld ops posted, none in doubt (kvxfer_engine_stats_ext)\n",
           (long long)s.ops_posted);
}

int main(void) {
    test_bad_input();
    test_id_without_nul();
    test_transfer();
    test_layer_parts();
    test_layer_parts_cuda();
    test_send_parallel_rank_without_peer();
    test_receive_run_first();
    test_callback_small_user();
    test_close_from_own_callback();
    test_last_error_cut();
    test_size_query();
    test_empty_dangling();
    test_stats();
    printf("PASS\n");
    return 0;
}
