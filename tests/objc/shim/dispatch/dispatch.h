/* A small stand-in for libdispatch, for the Objective-C tests on Linux:
 * Debian 12 ships GNUstep but no libdispatch. It has only what the wrapper
 * (bindings/objc/MLXRT.m) and tests/objc/test_objc.m use, with libdispatch's
 * names and meanings: serial queues (one thread each), dispatch_async,
 * queue-specific values, semaphores, dispatch_time, retain/release.
 * On Apple platforms, and wherever a real libdispatch exists, it is not used. */
#ifndef MLXRT_TEST_DISPATCH_SHIM_H
#define MLXRT_TEST_DISPATCH_SHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dispatch_queue_s *dispatch_queue_t;
typedef struct dispatch_semaphore_s *dispatch_semaphore_t;
typedef void *dispatch_queue_attr_t;
typedef uint64_t dispatch_time_t;
typedef void (^dispatch_block_t)(void);
typedef void (*dispatch_function_t)(void *);

#define DISPATCH_QUEUE_SERIAL ((dispatch_queue_attr_t)0)
#define DISPATCH_TIME_NOW ((dispatch_time_t)0)
#define DISPATCH_TIME_FOREVER (~(dispatch_time_t)0)
#ifndef NSEC_PER_SEC
#define NSEC_PER_SEC 1000000000ull
#endif
#ifndef NSEC_PER_MSEC
#define NSEC_PER_MSEC 1000000ull
#endif

/* Serial only: `attr` must be DISPATCH_QUEUE_SERIAL. */
dispatch_queue_t dispatch_queue_create(const char *label, dispatch_queue_attr_t attr);
void dispatch_async(dispatch_queue_t queue, dispatch_block_t block);
const char *dispatch_queue_get_label(dispatch_queue_t queue);
void dispatch_queue_set_specific(dispatch_queue_t queue, const void *key, void *context,
                                 dispatch_function_t destructor);
/* The value for `key` of the queue running the caller; NULL off any queue. */
void *dispatch_get_specific(const void *key);

dispatch_time_t dispatch_time(dispatch_time_t when, int64_t delta_ns);
dispatch_semaphore_t dispatch_semaphore_create(long value);
/* 0 when signalled, non-zero on timeout. */
long dispatch_semaphore_wait(dispatch_semaphore_t semaphore, dispatch_time_t timeout);
long dispatch_semaphore_signal(dispatch_semaphore_t semaphore);

/* Queues and semaphores. A queue's thread finishes its pending blocks
 * after the last release. */
void dispatch_retain(void *object);
void dispatch_release(void *object);

#ifdef __cplusplus
}
#endif

#endif
