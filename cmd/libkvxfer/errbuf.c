// The C side of libkvxfer: the per-thread error message and the callback
// trampoline, which marks its thread as in the engine's callback. Go code
// that runs for a C call runs on the caller's thread, so kvxfer_set_error
// stores into the caller's own buffer.
#include <string.h>

#include "kvxfer.h"

static __thread char kvxfer_error_buf[1024];

__attribute__((visibility("hidden"))) void kvxfer_set_error(const char *msg, size_t n) {
    if (n >= sizeof kvxfer_error_buf) {
        n = sizeof kvxfer_error_buf - 1;
        /* Cut before a character, not inside it: msg[n] is the first
         * byte left out, and a continuation byte there means the cut
         * splits a multi-byte character (the message stays UTF-8). */
        while (n > 0 && ((unsigned char)msg[n] & 0xC0) == 0x80) {
            n--;
        }
    }
    if (n > 0) {
        memcpy(kvxfer_error_buf, msg, n);
    }
    kvxfer_error_buf[n] = 0;
}

const char *kvxfer_last_error(void) { return kvxfer_error_buf; }

// The engine whose callback the calling thread is running (0: none). A
// call the callback makes into the library runs on this same thread (Go
// runs a C-to-Go call on the thread that made it, and the goroutine that
// invoked the callback is locked to that thread until it returns), so
// kvxfer_engine_close can tell that it was called from its own engine's
// callback, which it would wait for forever.
static __thread uint64_t kvxfer_callback_engine;

// user is the caller's void * as an integer: Go never holds it as a
// pointer (kvxfer_set_callback).
__attribute__((visibility("hidden"))) void kvxfer_invoke_callback(kvxfer_callback cb, const kvxfer_event *ev, uintptr_t user,
                                                                  uint64_t engine) {
    uint64_t outer = kvxfer_callback_engine;
    kvxfer_callback_engine = engine;
    cb(ev, (void *)user);
    kvxfer_callback_engine = outer;
}

// Whether the calling thread is running a callback of engine.
__attribute__((visibility("hidden"))) int kvxfer_in_callback_of(uint64_t engine) {
    return engine != 0 && kvxfer_callback_engine == engine;
}
