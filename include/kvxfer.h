/*
 * kvxfer.h: the C ABI of libkvxfer.so, kvxfer's KV-cache transfer engine
 * for disaggregated LLM serving (`make lib` builds both).
 *
 * Contract
 *
 *  - Handles are opaque 64-bit integers from one process-wide table (0 is
 *    never a valid handle). No Go pointer crosses the boundary: the library
 *    hands out integers and copies what the caller passes in.
 *  - Every call returns a kvxfer_status. On failure it also leaves a message
 *    naming the value that was wrong, retrievable on the calling thread with
 *    kvxfer_last_error() (errno-style: a successful call leaves the previous
 *    message in place; at most 1023 bytes, cut before a character, never
 *    inside one, so a message quotes only the
 *    first 64 bytes of an over-long value, with its length). Bad input (a
 *    bad handle, a null pointer, bad JSON, a misaligned chunk) is an error
 *    status, never a crash.
 *  - An array passed with a count (ids and n, buf and cap, runs and groups,
 *    a run's ids and count, a request's payload and payload_len, blocks and
 *    groups) is never read when its count is 0, whatever its pointer: NULL,
 *    or a dangling one such as Rust's empty slice's (0x4) are the same
 *    empty array. A non-zero count with NULL, or with a pointer below the
 *    first page (4096), is KVXFER_ERR_INVALID_ARGUMENT naming it.
 *  - Completions are polled: kvxfer_poll() returns finished requests as
 *    kvxfer_event records. A callback (kvxfer_set_callback) is optional; it
 *    runs on a thread the library owns, and must not unwind (no C++ exception,
 *    no longjmp) through the library.
 *  - Memory is registered as a pointer: kvxfer_engine_open's pool (or one the
 *    engine allocates); a node (kvxfer_node_open) allocates its own, memory
 *    its peers can write, found with kvxfer_engine_info_get, or uses the
 *    framework's tensors ("memory" with "layers"). The caller's
 *    memory must outlive the engine, and for good when kvxfer_engine_close
 *    returns KVXFER_ERR_TIMEOUT (see there). Block b of layer group g lives at
 *    pool + group.offset + b * group.block_bytes, its bytes ordered
 *    layer, part (K then V), head, token, dim (outermost first): a
 *    "cross-layer" block, HND inside each layer.
 *  - All calls are safe from any thread.
 *
 * Lifecycle of a request: kvxfer_send (context side) or kvxfer_receive
 * (generation side) returns a request handle; its completion arrives once as
 * an event; kvxfer_request_blocks / kvxfer_request_payload read its outcome;
 * kvxfer_request_release frees the handle. kvxfer_engine_close releases every
 * handle the engine still owns.
 */
#ifndef KVXFER_H
#define KVXFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes; kvxfer_abi_version() returns the library's.
 * Bumped on any incompatible change to a declaration below. */
#define KVXFER_ABI_VERSION 1
/* Additive changes within KVXFER_ABI_VERSION (new config keys, new
 * functions); 1: kvxfer_engine_open's "memory" key; 2: kvxfer_chunk_cuda;
 * 3: kvxfer_chunk_layers and kvxfer_chunk_layers_cuda; 4: the "memory"
 * object's dtype_bytes; 5: kvxfer_send_parallel, and kvxfer_receive checks
 * each destination run's first; 6: kvxfer_node_open over the framework's
 * own tensors ("memory" with "layers") or pool ("pool_address"), and its
 * "layout" key; 7: GPU memory by address: the "memory" object's device and
 * kvxfer_node_open's pool_device, and kvxfer_engine_pool_device; 8:
 * kvxfer_request_set_payload, and payloads of up to 65536 bytes; 9:
 * kvxfer_receive_stages; 10: kvxfer_engine_stats_get; 11:
 * kvxfer_engine_stats_ext_get (ops_in_doubt). Where a request struct
 * would need a new field, a new function takes it as an argument instead:
 * the structs keep their size, so a caller built against an older header
 * passes no shorter one than the library reads (and gets no longer one
 * written: kvxfer_engine_stats keeps its 240 bytes, and a counter added
 * after it goes at the end of kvxfer_engine_stats_ext, whose size the
 * caller passes to kvxfer_engine_stats_ext_get). */
#define KVXFER_ABI_MINOR 11

/* Status codes: what every call returns. A newer library of the same
 * KVXFER_ABI_VERSION may return codes added since (KVXFER_ERR_PEER_FAILED
 * in minor 8): treat a code you do not know as an error, its message in
 * kvxfer_last_error or kvxfer_request_error. */
typedef enum kvxfer_status {
    KVXFER_OK = 0,
    KVXFER_ERR_INVALID_ARGUMENT = 1, /* a null pointer, a negative count, bad value */
    KVXFER_ERR_BAD_HANDLE = 2,       /* no such handle, or a handle of another kind */
    KVXFER_ERR_CONFIG = 3,           /* bad config JSON or a config the engine refuses */
    KVXFER_ERR_BAD_CHUNK = 4,        /* misaligned, out of order, after the last, sources missing */
    KVXFER_ERR_BAD_REQUEST = 5,      /* a request the engine cannot take (id, length, blocks) */
    KVXFER_ERR_REQUEST_FAILED = 6,   /* the request's outcome is already decided */
    KVXFER_ERR_PIN = 7,              /* source blocks not allocated in the pool */
    KVXFER_ERR_TIMEOUT = 8,          /* the request's deadline passed */
    KVXFER_ERR_CANCELLED = 9,        /* cancelled on this side */
    KVXFER_ERR_PEER_CANCELLED = 10,  /* cancelled by the peer */
    KVXFER_ERR_PEER_GONE = 11,       /* a peer died or could not be reached */
    KVXFER_ERR_MISMATCH = 12,        /* the two sides disagree (length, bytes, layout, protocol) */
    KVXFER_ERR_FENCE = 13,           /* a chunk's fence failed */
    KVXFER_ERR_ENGINE_FAILED = 14,   /* the engine failed and refuses work */
    KVXFER_ERR_OUT_OF_BLOCKS = 15,   /* the pool has too few free blocks */
    KVXFER_ERR_BUFFER_TOO_SMALL = 16,/* an output buffer is too small (the size needed is returned) */
    KVXFER_ERR_NOT_FINISHED = 17,    /* the request has no outcome yet */
    KVXFER_ERR_UNSUPPORTED = 18,     /* not available in this build */
    KVXFER_ERR_CLOSED = 19,          /* the engine is closed or closing */
    KVXFER_ERR_INTERNAL = 20,        /* a bug in kvxfer (a recovered panic); the message says where */
    KVXFER_ERR_PEER_FAILED = 21      /* the peer failed the request; its reason is in the message (since
                                        KVXFER_ABI_MINOR 8; INTERNAL before) */
} kvxfer_status;

/* A request's outcome (kvxfer_event.outcome). */
typedef enum kvxfer_outcome {
    KVXFER_OUTCOME_DONE = 1,      /* context side: every byte written, every peer's Result sent, every pin dropped */
    KVXFER_OUTCOME_READY = 2,     /* generation side: the destination blocks hold the KV */
    KVXFER_OUTCOME_FAILED = 3,
    KVXFER_OUTCOME_CANCELLED = 4,
    KVXFER_OUTCOME_TIMED_OUT = 5
} kvxfer_outcome;

typedef uint64_t kvxfer_engine_t;
typedef uint64_t kvxfer_request_t;
typedef uint64_t kvxfer_fence_t;

/* One finished request. Posted once per request (unless its engine's
 * kvxfer_engine_close returned first): a context-side request
 * after its session released every pin (its source blocks may be freed);
 * a generation-side request once its outcome is decided and no write can
 * touch its destination blocks any more. */
typedef struct kvxfer_event {
    kvxfer_request_t request;
    int32_t outcome;   /* kvxfer_outcome */
    int32_t error;     /* kvxfer_status of the cause; KVXFER_OK on success */
    uint64_t bytes;    /* bytes written (context side) or received */
    uint64_t user_data;/* as passed to kvxfer_send / kvxfer_receive */
} kvxfer_event;

/* Consecutive global blocks of one request in one layer group: global block
 * first + i lives in pool block ids[i]. */
typedef struct kvxfer_block_run {
    int32_t first;
    uint32_t count;
    const int32_t *ids;
} kvxfer_block_run;

/* What one engine rank holds and where its pool lives. */
typedef struct kvxfer_engine_info {
    uint32_t groups;           /* layer groups (one block pool each) */
    uint32_t tokens_per_block;
    uint32_t kv_heads;         /* heads this rank holds */
    uint32_t head_dim;
    uint32_t dtype_bytes;
    uint32_t parts;            /* 2 (K, V) or 1 (MLA latent) */
    uint64_t pool_base;        /* address of the pool */
    uint64_t pool_bytes;
    uint64_t bytes_per_token;  /* this rank's KV bytes per token, all groups */
} kvxfer_engine_info;

typedef struct kvxfer_group_info {
    uint64_t offset;      /* pool offset of block 0 */
    uint64_t block_bytes; /* stride between blocks */
    uint32_t blocks;      /* block ids are [0, blocks) */
    uint32_t layers;      /* layers of the group this rank holds */
    int32_t window;       /* attention window in tokens, 0 = full */
    uint32_t reserved;
} kvxfer_group_info;

/* (Since KVXFER_ABI_MINOR 10.) An engine's counters, a snapshot
 * (kvxfer_engine_stats_get): Go's kvxfer.Stats, field for field, but for
 * those added since (kvxfer_engine_stats_ext). Counts (_total in the
 * metric names) only grow; the others say what is so now. Its size and
 * layout are fixed (240 bytes, 30 fields of 8 bytes). */
typedef struct kvxfer_engine_stats {
    int64_t ops_posted;       /* batches of writes handed to the data plane */
    int64_t worker_restarts;  /* sender workers restarted after a panic */
    int64_t frames_unsent;    /* control frames the control plane did not send (peer gone, queue full,
                               * RequestData held back for want of its writer's Hello) */
    /* Control frames refused on arrival (kvxfer_frames_rejected_total by
     * reason): invalid, not from the request's peer or instance,
     * unresolvable, past an instance's orphan limit (reasons invalid,
     * not_writer, unresolved, not_bound, orphan_limit). */
    int64_t frames_rejected;
    int64_t frames_stale;     /* too late to act on (reason stale) */
    int64_t frames_shed;      /* dropped: their peer's frame credits were spent (reason shed) */
    int64_t cancels_deferred; /* Cancels left unanswered for now, every cancel tombstone young; re-sent by
                               * their sender (reason tombstones_full) */
    /* Panics and refusals kvxfer survived (each logged), and lapsed leases. */
    int64_t session_panics;             /* sessions restarted after a panic (each request failed) */
    int64_t session_panics_past_budget; /* session panics past its restart budget (resumed to drain) */
    int64_t parent_panics;              /* top-level actor or listener panics: each failed the engine
                                         * (KVXFER_ERR_ENGINE_FAILED) */
    int64_t pin_errors;                 /* source pins and unpins the pool refused */
    int64_t leases_lapsed;              /* writer leases on peers that lapsed (its requests failed) */
    int64_t stream_violations;          /* peer streams that disagreed with their session (a bug) */
    /* Pages held. */
    int64_t blocks_revoked;               /* destination blocks revoked instead of quarantined */
    int64_t revoked_held_blocks;          /* now: revoked blocks whose old memory waits for its proof */
    int64_t caller_blocks_awaiting_proof; /* now: the caller's own destination blocks (kvxfer_receive_request
                                           * .blocks) of failed requests, waiting for a writer's proof;
                                           * not in quarantined_bytes */
    int64_t dest_block_errors;            /* quarantines, releases and frees of destination blocks the pool
                                           * refused (a bug): those blocks stay held for good */
    uint64_t quarantined_bytes;           /* now: destination bytes quarantined (a writer gave no proof that
                                           * its writes are over) */
    uint64_t quarantine_limit_bytes;      /* the bound past which receives wait for blocks */
    /* Writes in doubt. */
    int64_t closes_unproven;  /* data-plane endpoint closes that proved nothing about the writes on them:
                               * their ops stay in doubt, their requests keep their source pages unless
                               * the backend proved them released */
    int64_t frames_silenced;  /* Cancels and RequestData left unanswered for good after such a close
                               * (reason silenced) */
    int64_t waiting_for_blocks; /* now: receives waiting for destination blocks */
    int64_t orphan_requests;    /* now: requests a generation instance asked this context engine for,
                                 * that no kvxfer_send took yet */
    int64_t orphans_ended;      /* such requests that ended with no kvxfer_send taking them */
    /* Proofs that every write of one writer incarnation is over, by kind
     * (kvxfer_write_proofs_total), and the requests they concerned
     * (kvxfer_write_proof_requests_total). */
    int64_t write_proofs_exited;
    int64_t write_proof_requests_exited;
    int64_t write_proofs_pidfd_exit;
    int64_t write_proof_requests_pidfd_exit;
    int64_t write_proofs_drained_goodbye;
    int64_t write_proof_requests_drained_goodbye;
} kvxfer_engine_stats;

/* (Since KVXFER_ABI_MINOR 11.) The counters of Go's kvxfer.Stats added
 * after kvxfer_engine_stats, in the same snapshot
 * (kvxfer_engine_stats_ext_get). Fields of 8 bytes; a later minor adds
 * its counters at the end and never moves one, so a caller's struct from
 * an older header is a prefix of the library's. */
typedef struct kvxfer_engine_stats_ext {
    /* (Minor 11.) Now: ops (batches of writes) in doubt: their sender worker crashed, their
     * endpoint was cut or their request's deadline passed while they were on the wire, and no
     * endpoint close settled them yet; their requests keep their source pages. A close that
     * proves nothing (closes_unproven) leaves them in doubt for good. The metric
     * kvxfer_ops_in_doubt. */
    int64_t ops_in_doubt;
} kvxfer_engine_stats_ext;

/* The context side of a request (kvxfer_send). Strings are copied. */
typedef struct kvxfer_send_request {
    const char *id;              /* 1 to 256 bytes of UTF-8, else KVXFER_ERR_BAD_REQUEST naming it (no
                                  * more than 257 bytes are read: an id with no NUL in them is refused) */
    int32_t prompt_len;
    int32_t timeout_ms;          /* 0: the engine's transfer timeout; negative: KVXFER_ERR_INVALID_ARGUMENT */
    const void *payload;         /* handed to the generation side on READY; may be NULL */
    uint32_t payload_len;        /* at most 65536 bytes, else KVXFER_ERR_INVALID_ARGUMENT */
    const char *generation;      /* the generation instance, or NULL: first to ask */
    uint64_t user_data;
} kvxfer_send_request;

/* The generation side of a request (kvxfer_receive). */
typedef struct kvxfer_receive_request {
    const char *id;              /* as kvxfer_send_request's */
    int32_t prompt_len;
    int32_t timeout_ms;          /* as kvxfer_send_request's */
    const char *context;         /* the context instance */
    int32_t context_tp;          /* its parallelism; 0, 0 means 1 x 1; negative: */
    int32_t context_pp;          /* KVXFER_ERR_INVALID_ARGUMENT */
    /* Destination blocks the caller allocated itself, one run per layer
     * group (NULL: the engine allocates from its pool, and READY's blocks
     * are freed with kvxfer_blocks_free). Run g covers the global blocks
     * group g receives, [first, end): end = ceil(prompt_len /
     * tokens_per_block); first = (prompt_len - window) / tokens_per_block
     * for a sliding-window group whose window is shorter than the prompt,
     * else 0; raised to prefix_hit_blocks[g], at most end. Its first must be
     * that block: another is KVXFER_ERR_INVALID_ARGUMENT naming the group,
     * the run's first and the expected one (since KVXFER_ABI_MINOR 5; an
     * older library ignored first and READY's ids held other global blocks
     * than the caller's run said). A run with count 0 (a group this rank
     * holds no layer of, or nothing left to receive) is not checked. */
    const kvxfer_block_run *blocks;
    uint32_t groups;             /* entries in blocks (and in prefix_hit_blocks); 0: both are NULL,
                                  * whatever their pointers */
    const int32_t *prefix_hit_blocks; /* per group, may be NULL */
    uint64_t user_data;
} kvxfer_receive_request;

typedef void (*kvxfer_callback)(const kvxfer_event *event, void *user);

/* KVXFER_TYPES_ONLY (internal): the library's cgo preamble takes the types
 * without the prototypes, which cgo redeclares without const. */
#ifndef KVXFER_TYPES_ONLY

/* The library's KVXFER_ABI_VERSION. */
int32_t kvxfer_abi_version(void);

/* The message of the calling thread's last failed call ("" if none). The
 * buffer is the thread's own and stays valid until its next failed call. */
const char *kvxfer_last_error(void);

/* The name of a status code ("KVXFER_ERR_BAD_CHUNK"), static storage. */
const char *kvxfer_status_name(int32_t status);

/* Opens an in-process engine (loopback data plane; engines in one process
 * find each other by instance name); kvxfer_node_open is the cross-process
 * one. config_json is an object:
 *   instance (string), model (preset name) or layout {layers, kv_heads,
 *   head_dim, dtype_bytes (1, 2, 4 or 8), tokens_per_block, mla, groups:
 *   [{name, layers, window}]}, tokens_per_block, tp, pp, pp_stages (each pipeline stage's
 *   layer count, "7,8,8,7", when the stages split the layers otherwise
 *   than the first layers % pp one longer), rank_tp, rank_pp, pool_bytes,
 *   workers, transfer_timeout_ms, drain_grace_ms, backend ("loopback"),
 *   metrics_addr.
 * Unknown keys are refused, naming them. pool, when not NULL, is the
 * caller's memory of pool_bytes bytes (it must outlive the engine and
 * pool_bytes must agree with the config's pool_bytes when that is set);
 * NULL lets the engine allocate it, of pool_bytes bytes when not 0 (the
 * config's pool_bytes when set must then agree, else KVXFER_ERR_CONFIG
 * naming both), else of the config's.
 *
 * memory (since KVXFER_ABI_MINOR 1), instead of a pool: the framework's own
 * KV tensors, which must outlive the engine; pool must then be NULL and
 * pool_bytes 0. An object {kind, num_blocks, layers, v_layers, strides}:
 * kind "nhd" (vLLM's [2, num_blocks, block_size, kv_heads, head_dim] per
 * layer), "hnd" ([2, num_blocks, kv_heads, block_size, head_dim]),
 * "split_kv" (K and V tensors [num_blocks, block_size, kv_heads, head_dim])
 * or "mla" ([num_blocks, block_size, latent]); layers the address of each
 * layer's tensor (K's for split_kv) for every layer the rank holds, in
 * ascending layer order; v_layers the V tensors' addresses (split_kv only);
 * strides, optional, the byte strides {block, token, head, elem, kv} (kv:
 * from a joint tensor's K to its V) instead of the kind's contiguous ones;
 * dtype_bytes, optional (since KVXFER_ABI_MINOR 4), the tensors' element
 * size: one other than the layout's dtype_bytes (float32 tensors under a
 * bf16 model) is KVXFER_ERR_CONFIG naming both; device, optional (since
 * KVXFER_ABI_MINOR 7), the CUDA ordinal of the tensors (torch's
 * tensor.device.index), an integer >= 0: absent (or null), they are host
 * memory; given, the addresses are device pointers on that GPU (one region
 * over the same span, never read or written by the CPU). Only
 * kvxfer_node_open takes device memory: kvxfer_engine_open refuses a
 * device (and a pool_device) with KVXFER_ERR_CONFIG naming it, its loopback
 * data plane copying with the CPU; a bad ordinal (negative, not an
 * integer) is KVXFER_ERR_CONFIG naming the key and the value.
 * Block ids are then the framework's, [0, num_blocks): kvxfer_alloc_blocks
 * hands out and tracks ids only, and kvxfer_engine_group's offset and
 * block_bytes do not locate a block (block b of a layer is at the tensor's
 * address + b * the block stride). A generation engine's descriptors reach
 * its peers, which plan into them (NHD on one side, HND on the other, any
 * tensor parallelism).
 *
 * The environment: KVXFER_WORKERS and KVXFER_BACKEND fill what the JSON
 * leaves unset. The first engine or node opened also gives the library's
 * Go runtime (kvxfer's alone in the process) a heap floor, 64 MiB, so that
 * its collector runs every few thousand requests instead of every few
 * hundred (the control path's tail); KVXFER_GC_FLOOR sets it ("128MiB") or
 * turns it off ("off"), and a GOGC in the environment leaves the runtime's
 * pacing as it is. A value that cannot be read fails the open with
 * KVXFER_ERR_CONFIG, naming it. */
kvxfer_status kvxfer_engine_open(const char *config_json, void *pool, uint64_t pool_bytes,
                                 kvxfer_engine_t *out);

/* Opens a node, one rank of kvxfer across processes and machines (package
 * node): a ZeroMQ control link (CURVE unless "insecure"), the data plane
 * (ucx where the library has it, else shm), pool memory peers can write,
 * heartbeats that fail a silent peer's requests. config_json is node's JSON
 * config: instance, parallel {tp, pp}, rank {tp, pp}, model,
 * tokens_per_block, pool_bytes, memory {kind, num_blocks} (the framework's
 * KV tensors laid out back to back in layer order inside the pool, block
 * ids the framework's; since KVXFER_ABI_MINOR 1), send_only, workers,
 * backend ("auto", "ucx",
 * "shm", "loopback"), bind, peers [{instance, parallel, rank, endpoint,
 * public_key | public_key_file}], insecure, secret_key | key_file,
 * identities, heartbeat_interval (at least "10ms"), heartbeat_misses (0 =
 * 3, else at least 2), transfer_timeout,
 * drain_grace, writer_lease ("1s"-style durations; writer_lease 0 = off),
 * revoke_spare_bytes (the shm revocation reserve: 0 = an eighth of the
 * pool, < 0 = off), metrics_addr, trace_path, trace_max_bytes (the
 * trace file's bound, 0 = 1 GiB), trace_keep (0 = stop recording at the
 * bound, N = rotate it, keeping N earlier files PATH.1 ... PATH.N), and for
 * membership through etcd discovery ("static", "etcd://HOST:PORT",
 * "etcds://HOST:PORT" over TLS), cluster, discovery_ttl, discovery_ca,
 * discovery_cert, discovery_key, discovery_user, discovery_password_file
 * (docs/membership.md). The handle
 * is an engine handle: every engine call above works on it (the pool is the
 * node's: see kvxfer_engine_info_get), and kvxfer_engine_close closes the
 * node.
 *
 * Since KVXFER_ABI_MINOR 6: layout, kvxfer_engine_open's layout object,
 * instead of model (both is KVXFER_ERR_CONFIG); pool_address, the address
 * of the caller's pool of pool_bytes bytes (host memory, laid out as a
 * node's own pool, as kvxfer_engine_open's pool argument: vLLM's
 * cross-layer KV cache), refused with memory or without pool_bytes; and
 * memory with layers:
 * the framework's own KV tensors by address, kvxfer_engine_open's memory
 * object {kind, num_blocks, layers, v_layers, strides, dtype_bytes} (see
 * there; its errors name memory's keys), which the node then uses instead
 * of a pool of its own: peers write into the framework's tensors, block
 * ids are the framework's.
 *
 * Since KVXFER_ABI_MINOR 7, GPU memory: memory's device (see
 * kvxfer_engine_open) or pool_device (with pool_address), the CUDA ordinal
 * of the tensors or the pool, an integer >= 0 (absent: host memory; a bad
 * value is KVXFER_ERR_CONFIG naming the key and the value; pool_device
 * without pool_address, and device in a memory object without layers, are
 * refused). The node's memory is then that GPU's, over the same span. On
 * backend "cudaipc" the node runs on that GPU unless the config's "device"
 * names another (then refused at open, naming both): the ranks of one
 * instance can share one config, each over its own GPU's tensors.
 *
 * What can run over either, each refusal KVXFER_ERR_CONFIG naming the
 * value:
 *   - a rank that receives (not send_only) needs backend "ucx", which
 *     registers memory it did not allocate; "shm" (or "auto" in a library
 *     without UCX) is refused: its pool must live in its /dev/shm file.
 *     "loopback" reaches peers in this same process only.
 *   - a send_only rank's host tensors are only read by its own data plane:
 *     any backend but "cudaipc" (which moves GPU memory only).
 *   - GPU memory (device, pool_device), sending or receiving, needs a data
 *     plane that reaches it: "ucx" with a UCX built with CUDA (a UCX
 *     without it is refused at open, naming the memory types it
 *     registers), or "cudaipc" between processes of one host (CUDA IPC
 *     handles: no UCX needed); "shm" and "loopback" are refused naming
 *     the backend.
 *   - revoke_spare_bytes > 0 and a pool_bytes other than the tensors' span
 *     are refused; a peer's exit is no proof that its writes are over (no
 *     peer process maps the framework's memory): a failed request's blocks
 *     stay quarantined until the writer's Result or CancelAck.
 * The registered region spans the lowest tensor address to the end of the
 * highest, as kvxfer_engine_open's; UCX transports that pin memory (RDMA
 * verbs) need that whole span mapped: tensors of one allocation. The
 * tensors must outlive the node, and for good when kvxfer_engine_close
 * returns KVXFER_ERR_TIMEOUT (a peer may still write into them: never free
 * them then). */
kvxfer_status kvxfer_node_open(const char *config_json, kvxfer_engine_t *out);

/* The node's bound control endpoint (a tcp port 0 resolved), NUL-terminated;
 * KVXFER_ERR_BUFFER_TOO_SMALL names the size needed (buf NULL with cap 0
 * asks for it). */
kvxfer_status kvxfer_node_endpoint(kvxfer_engine_t node, char *buf, uint32_t cap);
/* The node's CURVE public key (Z85, 40 characters), "" when insecure; a
 * buffer too small as for kvxfer_node_endpoint. */
kvxfer_status kvxfer_node_public_key(kvxfer_engine_t node, char *buf, uint32_t cap);
/* Waits up to timeout_ms (0 or more) for every configured peer to say Hello
 * (KVXFER_ERR_TIMEOUT; a refused handshake is KVXFER_ERR_PEER_GONE, named).
 * A wait under way when kvxfer_engine_close of the node starts returns
 * KVXFER_ERR_CLOSED at once. */
kvxfer_status kvxfer_node_wait_peers(kvxfer_engine_t node, int32_t timeout_ms);
/* A new CURVE keypair, Z85: public and secret each need 41 bytes. */
kvxfer_status kvxfer_keygen(char *public_key, char *secret_key);

/* Fails every unfired fence, wakes every kvxfer_poll and
 * kvxfer_node_wait_peers blocked on the engine (they return
 * KVXFER_ERR_CLOSED), cancels live requests (their events carry
 * KVXFER_ERR_CLOSED), waits up to timeout_ms for every session to drain,
 * then stops the engine and releases every handle it owns. Once it
 * returns, whatever its status, no event of the engine is delivered any
 * more (no callback runs; a request that did not drain gets none). A negative timeout_ms is
 * KVXFER_ERR_INVALID_ARGUMENT, as is a call from the engine's own callback
 * (kvxfer_set_callback: it would wait for itself forever), and
 * KVXFER_ERR_CLOSED means another close of the engine is under way: each
 * leaves the engine as it was. Any other
 * status has closed it and released its handles.
 *
 * KVXFER_ERR_TIMEOUT: some requests did not drain by timeout_ms, or did
 * but keep destination blocks quarantined (their writers suspected, no
 * proof that their writes are over; the message names them). Their peers
 * may still be writing into this engine's memory, and nothing tells when
 * they stop:
 * the pool passed to kvxfer_engine_open (or the "memory" tensors) must
 * then stay allocated for the rest of the process, never freed or
 * unmapped (the engine's own pool stays mapped, leaked). */
kvxfer_status kvxfer_engine_close(kvxfer_engine_t engine, int32_t timeout_ms);

kvxfer_status kvxfer_engine_info_get(kvxfer_engine_t engine, kvxfer_engine_info *out);
/* Since KVXFER_ABI_MINOR 7: *device is the CUDA ordinal of the memory at
 * kvxfer_engine_info's pool_base (a node on backend "cudaipc", or a node
 * over GPU memory given by address: "memory" with "device", or
 * "pool_address" with "pool_device"), or -1 for host memory. On a GPU pool_base and
 * block addresses are device pointers: read and write them with CUDA,
 * never with the CPU. */
kvxfer_status kvxfer_engine_pool_device(kvxfer_engine_t engine, int32_t *device);
kvxfer_status kvxfer_engine_group(kvxfer_engine_t engine, uint32_t group, kvxfer_group_info *out);
/* (Since KVXFER_ABI_MINOR 10.) The engine's counters now, into *out (see
 * kvxfer_engine_stats); a node handle's are its engine's. Atomic loads
 * only: call it from any thread, as often as wanted, until
 * kvxfer_engine_close releases the handle. */
kvxfer_status kvxfer_engine_stats_get(kvxfer_engine_t engine, kvxfer_engine_stats *out);
/* (Since KVXFER_ABI_MINOR 11.) kvxfer_engine_stats_get into *out, and the
 * counters added since into *ext, from one snapshot. size is
 * sizeof(kvxfer_engine_stats_ext) as the caller's header has it (a
 * positive multiple of 8, else KVXFER_ERR_INVALID_ARGUMENT naming it):
 * the library writes the first min(size, its own size) bytes of *ext and
 * says how many in *written (may be NULL). Fewer than size: the library
 * is older than the caller's header, and the fields past *written are left
 * as they were (not counted by it). */
kvxfer_status kvxfer_engine_stats_ext_get(kvxfer_engine_t engine, kvxfer_engine_stats *out,
                                          kvxfer_engine_stats_ext *ext, size_t size, size_t *written);

/* Allocates n blocks of layer group `group` from the engine's pool into ids
 * (source blocks to fill before a chunk; all or nothing). */
kvxfer_status kvxfer_blocks_alloc(kvxfer_engine_t engine, uint32_t group, uint32_t n, int32_t *ids);
/* Frees blocks kvxfer_blocks_alloc or a READY outcome handed out. */
kvxfer_status kvxfer_blocks_free(kvxfer_engine_t engine, uint32_t group, const int32_t *ids, uint32_t n);
/* Blocks of group in use (allocated or pinned). */
kvxfer_status kvxfer_blocks_used(kvxfer_engine_t engine, uint32_t group, uint32_t *out);

/* Opens the context side of a request (typically when prefill starts);
 * kvxfer_send_parallel also tells the generation instance's parallelism. */
kvxfer_status kvxfer_send(kvxfer_engine_t engine, const kvxfer_send_request *req, kvxfer_request_t *out);

/* (Since KVXFER_ABI_MINOR 5.) kvxfer_send for a caller that knows the
 * generation instance's parallelism, generation_tp x generation_pp (0 and
 * 0: not told, as kvxfer_send). A context rank that writes to none of the
 * generation ranks (MLA with a context TP larger than the generation TP:
 * the context TP ranks from generation_tp up) then ends DONE at once,
 * pinning nothing: its event is posted right away, and chunks handed to it
 * afterwards are taken and go nowhere. Opened with kvxfer_send, such a
 * rank waits for a RequestData that never comes, holds its chunks' pins
 * and fails at its deadline. A negative value, or one of the two 0 and the
 * other not, is KVXFER_ERR_INVALID_ARGUMENT naming both; a parallelism
 * that cannot shard the model (a PP above the layer count, a TP that does
 * not divide the KV heads) is KVXFER_ERR_BAD_REQUEST naming it. */
kvxfer_status kvxfer_send_parallel(kvxfer_engine_t engine, const kvxfer_send_request *req, int32_t generation_tp,
                                   int32_t generation_pp, kvxfer_request_t *out);

/* Hands over one prefill chunk: tokens [start, end) whose KV sits in the
 * source blocks runs[0..groups) (one run per layer group). start, and end of
 * every chunk but the last, are multiples of tokens_per_block; chunks come
 * in order; last marks the chunk ending at prompt_len.
 * fence == NULL: the KV is already written. Otherwise *fence receives a
 * fence handle and the chunk is sent once kvxfer_fence_ready (or failed with
 * kvxfer_fence_fail) is called on it; either call releases the fence handle.
 * A refused chunk pins nothing, creates no fence, and the request goes on. */
kvxfer_status kvxfer_chunk(kvxfer_request_t request, int32_t start, int32_t end, int32_t last,
                           const kvxfer_block_run *runs, uint32_t groups, kvxfer_fence_t *fence);
kvxfer_status kvxfer_fence_ready(kvxfer_fence_t fence);

/* (Since KVXFER_ABI_MINOR 2.) kvxfer_chunk with a CUDA event as the fence:
 * the chunk is sent once cu_event has completed. cu_event is a CUevent (a
 * cudaEvent_t is the same handle: torch.cuda.Event's cuda_event, once
 * recorded) of device `device`'s primary context (the CUDA runtime's, so
 * PyTorch's), recorded on the producing stream after the chunk's writes.
 * The event is borrowed: kvxfer queries it (cuEventQuery, from its poller;
 * nobody blocks) and never records or destroys it. Keep it alive, and do
 * not record it again, until the request's kvxfer_event has arrived (or
 * kvxfer_engine_close returned): kvxfer stops querying it before either.
 * A failed query fails the request with KVXFER_ERR_FENCE and the driver's
 * error. KVXFER_ERR_UNSUPPORTED: no usable CUDA driver in this process (the
 * message names it; the handle is not touched); KVXFER_ERR_INVALID_ARGUMENT:
 * cu_event is 0, or no such device. A refused chunk pins nothing, watches
 * nothing, and the request goes on. */
kvxfer_status kvxfer_chunk_cuda(kvxfer_request_t request, int32_t start, int32_t end, int32_t last,
                                const kvxfer_block_run *runs, uint32_t groups, uint64_t cu_event, int32_t device);
/* Fails the chunk, and so the request (KVXFER_ERR_FENCE), with reason. */
kvxfer_status kvxfer_fence_fail(kvxfer_fence_t fence, const char *reason);

/* (Since KVXFER_ABI_MINOR 3.) kvxfer_chunk for one layer part of the chunk:
 * global layers [layer_lo, layer_hi) of its tokens, of a model of `layers`
 * layers, so that a chunk can leave layer by layer while the forward pass
 * still computes the later layers (vLLM's save_kv_layer). layer_lo ==
 * layer_hi == layers == 0 is the whole chunk, as kvxfer_chunk; otherwise
 * 0 <= layer_lo < layer_hi <= layers, and layers is the model's layer
 * count (every layer, not those this rank holds), else
 * KVXFER_ERR_BAD_CHUNK naming the values. start, end, runs and fence are
 * kvxfer_chunk's; each part has its own fence.
 *
 * The parts of one chunk come in layer order: the first starts at layer
 * 0, each next one where the one before ended, every part with the same
 * start, end, last and source blocks (runs with the same first and ids);
 * the part ending at layer `layers` completes the chunk, and no other
 * chunk (nor a whole chunk) is taken before it. last marks every part of
 * the final chunk; the request finishes only after the final part of the
 * last chunk has been sent. Layers are the model's: on a rank of a later
 * pipeline stage too, the first part starts at layer 0 (it may hold none
 * of the rank's layers). A part out of that order is KVXFER_ERR_BAD_CHUNK,
 * its message naming the part's layers and where the next part starts; a
 * refused part pins nothing, creates no fence, and the request goes on
 * (hand the right part next). */
kvxfer_status kvxfer_chunk_layers(kvxfer_request_t request, int32_t start, int32_t end, int32_t last,
                                  int32_t layer_lo, int32_t layer_hi, int32_t layers,
                                  const kvxfer_block_run *runs, uint32_t groups, kvxfer_fence_t *fence);

/* (Since KVXFER_ABI_MINOR 3.) kvxfer_chunk_layers with a CUDA event as the
 * part's fence, as kvxfer_chunk_cuda (typically an event recorded after
 * layer layer_hi - 1's attention). Bad layers are refused before the
 * driver or the event is touched; a refused part watches nothing. */
kvxfer_status kvxfer_chunk_layers_cuda(kvxfer_request_t request, int32_t start, int32_t end, int32_t last,
                                       int32_t layer_lo, int32_t layer_hi, int32_t layers,
                                       const kvxfer_block_run *runs, uint32_t groups, uint64_t cu_event,
                                       int32_t device);

/* Opens the generation side of a request. The context instance's
 * pipeline stages (req->context_pp of them) hold kvxfer's default split of
 * the layers (the first layers % context_pp stages one layer longer); for
 * another split, kvxfer_receive_stages. */
kvxfer_status kvxfer_receive(kvxfer_engine_t engine, const kvxfer_receive_request *req, kvxfer_request_t *out);

/* (Since KVXFER_ABI_MINOR 9.) kvxfer_receive for a context instance whose
 * pipeline splits its layers otherwise than kvxfer's default (vLLM's
 * VLLM_PP_LAYER_PARTITION, TensorRT-LLM's pp_partition, or vLLM's own
 * default for an uneven count): context_pp_stages is the layer count of
 * each of its req->context_pp stages, in stage order, comma-separated
 * ("7,8,8,7"), as that instance's engine config says it in pp_stages.
 * NULL or "" is the default split, as kvxfer_receive. A value that is no
 * such list (a count that is not an integer >= 1, spaces), whose count of
 * stages is not req->context_pp, or whose counts do not add up to the
 * model's layers, is KVXFER_ERR_INVALID_ARGUMENT naming it; nothing is
 * opened. The string is copied. (A node that knows the context instance,
 * through discovery or its peers, takes its parallelism and split from
 * there when context_tp and context_pp are 0 and 0.) */
kvxfer_status kvxfer_receive_stages(kvxfer_engine_t engine, const kvxfer_receive_request *req,
                                    const char *context_pp_stages, kvxfer_request_t *out);

/* Cancels a live request (its event still arrives); no-op once finished. */
kvxfer_status kvxfer_cancel(kvxfer_request_t request);

/* Moves up to n finished events into events; *got is how many. Never blocks
 * when timeout_ms is 0; else waits up to timeout_ms for the first event (a
 * negative timeout_ms is KVXFER_ERR_INVALID_ARGUMENT).
 * Once kvxfer_engine_close has started, it returns the events still queued
 * and then KVXFER_ERR_CLOSED (*got 0); a poll blocked when the close
 * starts returns at once. */
kvxfer_status kvxfer_poll(kvxfer_engine_t engine, kvxfer_event *events, uint32_t n, uint32_t *got,
                          int32_t timeout_ms);

/* Delivers each event to cb (on a library thread) instead of the poll queue;
 * cb == NULL goes back to polling. A callback being replaced may still run
 * for an event already on its way: keep it callable until
 * kvxfer_engine_close returns (after it, none runs, even when the close
 * timed out). It may call any function here; kvxfer_engine_close of its
 * own engine, which waits for every callback under way, that one too, is
 * refused there (KVXFER_ERR_INVALID_ARGUMENT, the message saying it was
 * called from its own callback; nothing is closed): close the engine from
 * another thread once the callback returned (signal that thread from the
 * callback). Closing another engine from the callback works (unless that
 * engine's callback closes this one meanwhile: each waits for the other),
 * as does any call of this engine (a kvxfer_poll there waits its
 * timeout_ms for events that go to the callback); a callback that blocks
 * until another thread's kvxfer_engine_close of its engine returns waits
 * forever. cb may run on several library threads at once (requests
 * finishing together), so it must be safe for that; event points to a
 * record that is valid only during the call (copy what you keep); user is
 * handed back as given and never dereferenced (any value, an integer cast
 * to void * too). Events queued before cb was set stay for kvxfer_poll. */
kvxfer_status kvxfer_set_callback(kvxfer_engine_t engine, kvxfer_callback cb, void *user);

/* The destination blocks of a READY request's group: writes up to cap ids,
 * *n is the count (KVXFER_ERR_BUFFER_TOO_SMALL if cap < *n). *first is the
 * global index of the first block. */
kvxfer_status kvxfer_request_blocks(kvxfer_request_t request, uint32_t group, int32_t *ids, uint32_t cap,
                                    uint32_t *n, int32_t *first);
/* The context side's payload of a READY request, as kvxfer_request_blocks:
 * writes up to cap bytes, *n is the size (KVXFER_ERR_BUFFER_TOO_SMALL if
 * cap < *n); a finished request that is not READY (a send, a failed or
 * cancelled receive) is KVXFER_ERR_INVALID_ARGUMENT. */
kvxfer_status kvxfer_request_payload(kvxfer_request_t request, void *buf, uint32_t cap, uint32_t *n);
/* The outcome's message ("" on success) into buf (NUL-terminated, truncated
 * to cap - 1 bytes or fewer: before a character, never inside one). */
kvxfer_status kvxfer_request_error(kvxfer_request_t request, char *buf, uint32_t cap);
/* Frees a READY request's destination blocks into the engine's pool, once,
 * when the engine allocated them: the same as kvxfer_blocks_free on each
 * group's kvxfer_request_blocks, in one call. A receive into blocks the
 * caller passed in (kvxfer_receive_request.blocks) is refused with
 * KVXFER_ERR_INVALID_ARGUMENT: those are the caller's to free. */
kvxfer_status kvxfer_request_free_blocks(kvxfer_request_t request);
/* Sets the payload a send's generation side gets with SUCCESS, replacing
 * kvxfer_send_request.payload: for what is known only when prefill ends
 * (the first token, a framework's per-request metadata). Copies n bytes
 * (at most 65536, else KVXFER_ERR_INVALID_ARGUMENT) of buf (NULL with n
 * 0: an empty payload). Call it before the last chunk, or its last layer
 * part: the next of them carries it; after that, KVXFER_ERR_BAD_REQUEST
 * (KVXFER_ERR_REQUEST_FAILED once the outcome is decided). A receive is
 * KVXFER_ERR_INVALID_ARGUMENT. Since KVXFER_ABI_MINOR 8. */
kvxfer_status kvxfer_request_set_payload(kvxfer_request_t request, const void *buf, uint32_t n);
/* Frees a finished request's handle (KVXFER_ERR_NOT_FINISHED before its event). */
kvxfer_status kvxfer_request_release(kvxfer_request_t request);

/* Live handles of every kind in the process (for leak checks). */
uint64_t kvxfer_handle_count(void);

/* Benchmark aid: drives iters transfers of prompt_len tokens in chunks of
 * chunk_tokens from engine src to engine dst entirely in Go (the same calls
 * the C ABI makes, without the boundary), for comparison with a transfer
 * driven through this ABI. *seconds is the wall time, *bytes the bytes moved.
 * A negative prompt_len or iters is KVXFER_ERR_INVALID_ARGUMENT naming it. */
kvxfer_status kvxfer_bench_go(kvxfer_engine_t src, kvxfer_engine_t dst, int32_t prompt_len,
                              int32_t chunk_tokens, int32_t iters, double *seconds, uint64_t *bytes);

#endif /* KVXFER_TYPES_ONLY */

#ifdef __cplusplus
}
#endif
#endif /* KVXFER_H */
