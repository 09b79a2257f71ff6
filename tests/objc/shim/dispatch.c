/* See dispatch/dispatch.h: a test-only libdispatch subset on pthreads.
 * Compiled with clang -fblocks, linked with libBlocksRuntime. */
#define _POSIX_C_SOURCE 200809L
#include "dispatch/dispatch.h"

#include <Block.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

enum { KIND_QUEUE = 1, KIND_SEMAPHORE = 2, MAX_SPECIFIC = 8 };

/* Both object kinds start with this header. */
struct object {
  int kind;
  int refs; /* guarded by the object's mutex */
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

struct item {
  dispatch_block_t block;
  struct item *next;
};

struct dispatch_queue_s {
  struct object o;
  char label[64];
  struct item *head, *tail;
  struct {
    const void *key;
    void *value;
    dispatch_function_t destructor;
  } specific[MAX_SPECIFIC];
  int n_specific;
};

struct dispatch_semaphore_s {
  struct object o;
  long value;
};

static __thread dispatch_queue_t current_queue;

/* The queue's thread: runs blocks in order; after the last release it
 * drains what is left and frees the queue. */
static void *worker(void *arg) {
  dispatch_queue_t q = arg;
  current_queue = q;
  pthread_mutex_lock(&q->o.mu);
  for (;;) {
    while (!q->head && q->o.refs > 0) pthread_cond_wait(&q->o.cv, &q->o.mu);
    if (!q->head) break;
    struct item *it = q->head;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->o.mu);
    it->block();
    Block_release(it->block);
    free(it);
    pthread_mutex_lock(&q->o.mu);
  }
  pthread_mutex_unlock(&q->o.mu);
  for (int i = 0; i < q->n_specific; i++)
    if (q->specific[i].destructor) q->specific[i].destructor(q->specific[i].value);
  pthread_mutex_destroy(&q->o.mu);
  pthread_cond_destroy(&q->o.cv);
  free(q);
  return NULL;
}

static void object_init(struct object *o, int kind) {
  o->kind = kind;
  o->refs = 1;
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
}

dispatch_queue_t dispatch_queue_create(const char *label, dispatch_queue_attr_t attr) {
  if (attr != DISPATCH_QUEUE_SERIAL) abort(); /* concurrent queues are not needed here */
  dispatch_queue_t q = calloc(1, sizeof *q);
  object_init(&q->o, KIND_QUEUE);
  snprintf(q->label, sizeof q->label, "%s", label ? label : "");
  pthread_t t;
  if (pthread_create(&t, NULL, worker, q) != 0) abort();
  pthread_detach(t);
  return q;
}

const char *dispatch_queue_get_label(dispatch_queue_t queue) {
  return queue ? queue->label : (current_queue ? current_queue->label : "");
}

void dispatch_async(dispatch_queue_t q, dispatch_block_t block) {
  struct item *it = calloc(1, sizeof *it);
  it->block = Block_copy(block);
  pthread_mutex_lock(&q->o.mu);
  if (q->tail) q->tail->next = it;
  else q->head = it;
  q->tail = it;
  pthread_cond_signal(&q->o.cv);
  pthread_mutex_unlock(&q->o.mu);
}

void dispatch_queue_set_specific(dispatch_queue_t q, const void *key, void *context,
                                 dispatch_function_t destructor) {
  pthread_mutex_lock(&q->o.mu);
  if (q->n_specific < MAX_SPECIFIC) {
    q->specific[q->n_specific].key = key;
    q->specific[q->n_specific].value = context;
    q->specific[q->n_specific].destructor = destructor;
    q->n_specific++;
  }
  pthread_mutex_unlock(&q->o.mu);
}

void *dispatch_get_specific(const void *key) {
  dispatch_queue_t q = current_queue;
  if (!q) return NULL;
  void *value = NULL;
  pthread_mutex_lock(&q->o.mu);
  for (int i = 0; i < q->n_specific; i++)
    if (q->specific[i].key == key) value = q->specific[i].value;
  pthread_mutex_unlock(&q->o.mu);
  return value;
}

dispatch_time_t dispatch_time(dispatch_time_t when, int64_t delta_ns) {
  if (when == DISPATCH_TIME_FOREVER) return when;
  if (when == DISPATCH_TIME_NOW) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    when = (uint64_t)t.tv_sec * NSEC_PER_SEC + (uint64_t)t.tv_nsec;
  }
  return when + (uint64_t)delta_ns;
}

dispatch_semaphore_t dispatch_semaphore_create(long value) {
  dispatch_semaphore_t s = calloc(1, sizeof *s);
  object_init(&s->o, KIND_SEMAPHORE);
  s->value = value;
  return s;
}

long dispatch_semaphore_wait(dispatch_semaphore_t s, dispatch_time_t timeout) {
  struct timespec deadline = {(time_t)(timeout / NSEC_PER_SEC), (long)(timeout % NSEC_PER_SEC)};
  int rc = 0;
  pthread_mutex_lock(&s->o.mu);
  while (s->value <= 0 && rc != ETIMEDOUT) {
    if (timeout == DISPATCH_TIME_FOREVER) pthread_cond_wait(&s->o.cv, &s->o.mu);
    else rc = pthread_cond_timedwait(&s->o.cv, &s->o.mu, &deadline);
  }
  long result = s->value > 0 ? (s->value--, 0) : 1;
  pthread_mutex_unlock(&s->o.mu);
  return result;
}

long dispatch_semaphore_signal(dispatch_semaphore_t s) {
  pthread_mutex_lock(&s->o.mu);
  s->value++;
  pthread_cond_signal(&s->o.cv);
  pthread_mutex_unlock(&s->o.mu);
  return 0;
}

void dispatch_retain(void *object) {
  struct object *o = object;
  pthread_mutex_lock(&o->mu);
  o->refs++;
  pthread_mutex_unlock(&o->mu);
}

void dispatch_release(void *object) {
  struct object *o = object;
  int kind = o->kind; /* a queue may be freed by its worker once unlocked */
  pthread_mutex_lock(&o->mu);
  int refs = --o->refs;
  if (kind == KIND_QUEUE) pthread_cond_signal(&o->cv); /* the worker frees it */
  pthread_mutex_unlock(&o->mu);
  if (refs == 0 && kind == KIND_SEMAPHORE) {
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
  }
}
