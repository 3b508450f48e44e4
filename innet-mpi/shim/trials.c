/* The non-blocking kinds' timed trial calls (see below): which started calls are timed,
 * and the Wait and Test forms' report of the ones they found complete. */
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

/* Timed trial calls of the non-blocking kinds' learned cutover (learn/started.rs): from
 * a call's start until the application's MPI_Wait or MPI_Test finds it complete. Trials run
 * below MPI_THREAD_MULTIPLE only, so one application thread at a time touches the table.
 * Bounded: beyond TRIALS_MAX calls in flight the oldest entry gives way (its sample is
 * lost, the learner decides on the rest). */
enum { TRIALS_MAX = 64 };
struct nb_trial {
    MPI_Request request;
    struct comm_state *st;
    int kind;
    uint32_t ticket;
    size_t bytes;
    struct timespec t0;
};
static struct nb_trial trials[TRIALS_MAX];
static int trial_count, trial_oldest;


/* After the start: a timed trial call's request is watched until the application sees it
 * complete. */
void nb_watch(const struct nb_route *r, MPI_Request request) {
    if (!r->st || !(r->bits & INNET_ROUTE_TRIAL) || request == MPI_REQUEST_NULL) return;
    struct nb_trial t = {request, r->st, r->kind, r->ticket, r->bytes, r->t0};
    if (trial_count < TRIALS_MAX) {
        trials[trial_count++] = t;
    } else {
        trials[trial_oldest] = t;
        trial_oldest = (trial_oldest + 1) % TRIALS_MAX;
    }
}

/* The application found `request` complete: a trial call's time goes to the learner. */
static void trial_seen(MPI_Request request, const struct timespec *now) {
    for (int i = 0; i < trial_count; i++) {
        if (trials[i].request != request) continue;
        struct nb_trial t = trials[i];
        trials[i] = trials[--trial_count];
        trial_oldest = 0;
        uint64_t ns = (uint64_t)(now->tv_sec - t.t0.tv_sec) * 1000000000u +
                      (uint64_t)(now->tv_nsec - t.t0.tv_nsec);
        if (t.st->session) innet_mpi_took(t.st->session, t.kind, t.bytes, t.ticket, ns);
        return;
    }
}

/* A communicator goes: its watched calls with it. */
void trials_forget(const struct comm_state *st) {
    for (int i = 0; i < trial_count;)
        if (trials[i].st == st) trials[i] = trials[--trial_count];
        else i++;
    trial_oldest = 0;
}


void seen_begin(struct seen *v, int n, const MPI_Request *reqs) {
    v->before = NULL;
    v->n = 0;
    if (trial_count == 0 || n <= 0) return;
    v->before = n <= 16 ? v->local : malloc((size_t)n * sizeof *reqs);
    if (!v->before) return; /* no memory: these samples are lost, nothing else */
    memcpy(v->before, reqs, (size_t)n * sizeof *reqs);
    v->n = n;
}

/* Request `i` (or every one, -1) was found complete. */
void seen_done(struct seen *v, int i) {
    if (!v->before) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (int k = i < 0 ? 0 : i; k < (i < 0 ? v->n : i + 1) && k < v->n; k++)
        if (v->before[k] != MPI_REQUEST_NULL) trial_seen(v->before[k], &now);
}

void seen_end(struct seen *v) {
    if (v->before && v->before != v->local) free(v->before);
}
