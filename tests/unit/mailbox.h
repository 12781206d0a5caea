/* An in-memory pl_stage_link for tests: messages keyed by (to, from, kind, mb);
 * send copies and returns at once (never a rendezvous), recv waits for its
 * message. Endpoints are stage indices; one mailbox per pipeline. */
#ifndef PLIANT_TEST_MAILBOX_H
#define PLIANT_TEST_MAILBOX_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "stage.h"

#define MAILBOX_SLOTS 4096

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct {
        int to, from, kind, mb, used;
        float *data;
        size_t n;
    } msg[MAILBOX_SLOTS];
} mailbox;

typedef struct {
    mailbox *box;
    int self;
} endpoint;

static mailbox *mailbox_new(void)
{
    mailbox *b = calloc(1, sizeof *b);
    if (!b) abort();
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    return b;
}

static void mailbox_free(mailbox *b)
{
    for (int i = 0; i < MAILBOX_SLOTS; i++)
        if (b->msg[i].used) free(b->msg[i].data);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

static int box_send(void *ctx, int peer, pl_link_kind kind, int mb, const float *buf, size_t n,
                    char *err, size_t errlen)
{
    (void)err, (void)errlen;
    endpoint *ep = ctx;
    mailbox *b = ep->box;
    float *copy = malloc(n * sizeof *copy);
    if (!copy) abort();
    memcpy(copy, buf, n * sizeof *copy);
    pthread_mutex_lock(&b->mu);
    int i = 0;
    while (i < MAILBOX_SLOTS && b->msg[i].used) i++;
    if (i == MAILBOX_SLOTS) abort();
    b->msg[i].to = peer, b->msg[i].from = ep->self, b->msg[i].kind = kind, b->msg[i].mb = mb;
    b->msg[i].data = copy, b->msg[i].n = n, b->msg[i].used = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static int box_recv(void *ctx, int peer, pl_link_kind kind, int mb, float *buf, size_t n,
                    char *err, size_t errlen)
{
    (void)err, (void)errlen;
    endpoint *ep = ctx;
    mailbox *b = ep->box;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        for (int i = 0; i < MAILBOX_SLOTS; i++)
            if (b->msg[i].used && b->msg[i].to == ep->self && b->msg[i].from == peer &&
                b->msg[i].kind == (int)kind && b->msg[i].mb == mb) {
                int ok = b->msg[i].n == n;
                if (ok) memcpy(buf, b->msg[i].data, n * sizeof *buf);
                free(b->msg[i].data);
                b->msg[i].used = 0;
                pthread_mutex_unlock(&b->mu);
                return ok ? 0 : -1;
            }
        pthread_cond_wait(&b->cv, &b->mu);
    }
}

/* pl_stage_link.ready: 1 when that message is in the box. */
static inline int box_ready(void *ctx, int peer, pl_link_kind kind, int mb)
{
    endpoint *ep = ctx;
    mailbox *b = ep->box;
    int there = 0;
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < MAILBOX_SLOTS && !there; i++)
        there = b->msg[i].used && b->msg[i].to == ep->self && b->msg[i].from == peer &&
                b->msg[i].kind == (int)kind && b->msg[i].mb == mb;
    pthread_mutex_unlock(&b->mu);
    return there;
}

#endif
