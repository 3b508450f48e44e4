/* The interposer's non-blocking collectives and the MPI_Test and MPI_Wait forms that
 * complete them (see the comment below); innet_mpi.c has the rest. */
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

/* Non-blocking collectives: MPI_Iallreduce, MPI_Ireduce, MPI_Ibcast and MPI_Ibarrier start
 * an innet allreduce under a generalized request and return; innet's progress thread (one
 * per communicator) runs it while the program computes, so MPI_Test/Wait and their
 * -all/-any/-some forms and MPI_Request_get_status work on it unchanged. Who completes the
 * generalized request (MPI_Grequest_complete) depends on the application's thread level:
 * - MPI_THREAD_MULTIPLE (asked for by the application): innet's progress thread, at once.
 * - any lower level: the application's own thread. The progress thread only marks the call
 *   finished; the intercepted MPI_Test* and MPI_Wait* calls complete the finished innet
 *   requests they are given before handing them to MPI. Before that they run the started
 *   calls themselves when the progress thread has not taken them (it leaves them to the
 *   application while their answers travel: whichever thread gets there first takes the
 *   results; the test forms only when the answers are in already), and the wait forms
 *   then sleep on innet's condition variable until those they wait for are finished. Completing from
 *   another thread below MPI_THREAD_MULTIPLE would race MPI: Open MPI 4.1's
 *   ompi_grequest_complete releases the request with an atomic decrement only when
 *   opal_using_threads().
 * Each kind learns its own way, on its calls' start-to-completion times (the trial table
 * below; Policy::route in innet-client). */
struct nb_call {
    MPI_Request request; /* the generalized request */
    struct comm_state *st;
    int error;            /* MPI_SUCCESS, or MPI_ERR_OTHER once innet failed */
    int finished;         /* innet is done; guarded by `pending_lock` */
    struct nb_call *next; /* outstanding calls, guarded by `pending_lock` */
};

/* innet's calls whose generalized requests the application's thread has not completed. */
static struct nb_call *outstanding;
static _Atomic int outstanding_count;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pending_done = PTHREAD_COND_INITIALIZER;

/* A completed collective's status: the empty status (no source, tag or elements), the
 * error of a failed call. */
static int nb_query(void *extra, MPI_Status *status) {
    struct nb_call *c = extra;
    PMPI_Status_set_elements(status, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(status, 0);
    status->MPI_SOURCE = MPI_ANY_SOURCE;
    status->MPI_TAG = MPI_ANY_TAG;
    status->MPI_ERROR = c->error;
    return c->error;
}

static int nb_free(void *extra) {
    free(extra);
    return MPI_SUCCESS;
}

/* A collective cannot be cancelled (every rank takes part): it runs to its end. */
static int nb_cancel(void *extra, int complete) {
    (void)extra;
    (void)complete;
    return MPI_SUCCESS;
}

/* innet's completion, on its progress thread (or in a later innet call on the same
 * communicator): the result is in the receive buffer. */
static void nb_done(void *arg, int failed) {
    struct nb_call *c = arg;
    if (failed) {
        c->error = MPI_ERR_OTHER;
        c->st->broken = 1;
    }
    if (complete_on_progress_thread) {
        PMPI_Grequest_complete(c->request);
        return;
    }
    pthread_mutex_lock(&pending_lock);
    c->finished = 1;
    pthread_cond_broadcast(&pending_done);
    pthread_mutex_unlock(&pending_lock);
}

/* Lists a started call for the application's thread to complete. */
static void track(struct nb_call *c) {
    pthread_mutex_lock(&pending_lock);
    c->next = outstanding;
    outstanding = c;
    outstanding_count++;
    pthread_mutex_unlock(&pending_lock);
}

/* The link to the outstanding innet call of `request`, or NULL. Caller holds
 * `pending_lock`. */
static struct nb_call **find_call(MPI_Request request) {
    for (struct nb_call **p = &outstanding; *p; p = &(*p)->next)
        if ((*p)->request == request) return p;
    return NULL;
}

/* On the application's thread: completes the generalized requests of innet's finished
 * calls among `reqs`; with `wait`, first sleeps until each innet call among them is
 * finished. MPI then sees them as any completed generalized request. */
static void settle(int n, const MPI_Request *reqs, int wait) {
    if (outstanding_count == 0 || complete_on_progress_thread) return;
    pthread_mutex_lock(&pending_lock);
    for (int i = 0; i < n; i++) {
        struct nb_call **p = find_call(reqs[i]);
        if (p && !(*p)->finished) {
            /* Take the results here unless innet's progress thread has the call already:
             * no hand-over between two threads (a test only takes results already in). */
            void *session = (*p)->st->session;
            pthread_mutex_unlock(&pending_lock);
            innet_mpi_progress(session, wait);
            pthread_mutex_lock(&pending_lock);
            p = find_call(reqs[i]);
        }
        while (p && wait && !(*p)->finished) {
            pthread_cond_wait(&pending_done, &pending_lock);
            p = find_call(reqs[i]);
        }
        if (!p || !(*p)->finished) continue;
        struct nb_call *c = *p;
        *p = c->next;
        outstanding_count--;
        pthread_mutex_unlock(&pending_lock);
        /* MPI frees c (nb_free) only when the application's test or wait frees the request. */
        PMPI_Grequest_complete(c->request);
        pthread_mutex_lock(&pending_lock);
    }
    pthread_mutex_unlock(&pending_lock);
}

/* Whether `reqs` hold an innet call whose request is not completed yet. */
static int holds_outstanding(int n, const MPI_Request *reqs) {
    if (outstanding_count == 0 || complete_on_progress_thread) return 0;
    int found = 0;
    pthread_mutex_lock(&pending_lock);
    for (int i = 0; i < n && !found; i++) found = find_call(reqs[i]) != NULL;
    pthread_mutex_unlock(&pending_lock);
    return found;
}

EXPORT int MPI_Wait(MPI_Request *request, MPI_Status *status) {
    struct seen v;
    seen_begin(&v, 1, request);
    settle(1, request, 1);
    int rc = PMPI_Wait(request, status);
    if (rc == MPI_SUCCESS) seen_done(&v, -1);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Waitall(int count, MPI_Request reqs[], MPI_Status statuses[]) {
    struct seen v;
    seen_begin(&v, count, reqs);
    settle(count, reqs, 1);
    int rc = PMPI_Waitall(count, reqs, statuses);
    if (rc == MPI_SUCCESS) seen_done(&v, -1);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status) {
    struct seen v;
    seen_begin(&v, 1, request);
    settle(1, request, 0);
    int rc = PMPI_Test(request, flag, status);
    if (rc == MPI_SUCCESS && *flag) seen_done(&v, -1);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status statuses[]) {
    struct seen v;
    seen_begin(&v, count, reqs);
    settle(count, reqs, 0);
    int rc = PMPI_Testall(count, reqs, flag, statuses);
    if (rc == MPI_SUCCESS && *flag) seen_done(&v, -1);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Testany(int count, MPI_Request reqs[], int *index, int *flag,
                       MPI_Status *status) {
    struct seen v;
    seen_begin(&v, count, reqs);
    settle(count, reqs, 0);
    int rc = PMPI_Testany(count, reqs, index, flag, status);
    if (rc == MPI_SUCCESS && *flag && *index != MPI_UNDEFINED) seen_done(&v, *index);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Testsome(int incount, MPI_Request reqs[], int *outcount, int indices[],
                        MPI_Status statuses[]) {
    struct seen v;
    seen_begin(&v, incount, reqs);
    settle(incount, reqs, 0);
    int rc = PMPI_Testsome(incount, reqs, outcount, indices, statuses);
    if (rc == MPI_SUCCESS && *outcount != MPI_UNDEFINED)
        for (int k = 0; k < *outcount; k++) seen_done(&v, indices[k]);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Request_get_status(MPI_Request request, int *flag, MPI_Status *status) {
    struct seen v;
    seen_begin(&v, 1, &request);
    settle(1, &request, 0);
    int rc = PMPI_Request_get_status(request, flag, status);
    if (rc == MPI_SUCCESS && *flag) seen_done(&v, -1);
    seen_end(&v);
    return rc;
}

/* Any or some of a set that holds innet calls: whichever finishes first, innet's or MPI's,
 * so neither side's requests may hold up the other's. Polls with MPI's test form, yielding
 * the CPU in between, as MPI's own wait does when idle. */
EXPORT int MPI_Waitany(int count, MPI_Request reqs[], int *index, MPI_Status *status) {
    struct seen v;
    seen_begin(&v, count, reqs);
    int rc, flag = 1;
    if (!holds_outstanding(count, reqs)) {
        rc = PMPI_Waitany(count, reqs, index, status);
    } else {
        for (;;) {
            flag = 0;
            settle(count, reqs, 0);
            rc = PMPI_Testany(count, reqs, index, &flag, status);
            if (rc != MPI_SUCCESS || flag) break;
            sched_yield();
        }
    }
    if (rc == MPI_SUCCESS && flag && *index != MPI_UNDEFINED) seen_done(&v, *index);
    seen_end(&v);
    return rc;
}

EXPORT int MPI_Waitsome(int incount, MPI_Request reqs[], int *outcount, int indices[],
                        MPI_Status statuses[]) {
    struct seen v;
    seen_begin(&v, incount, reqs);
    int rc;
    if (!holds_outstanding(incount, reqs)) {
        rc = PMPI_Waitsome(incount, reqs, outcount, indices, statuses);
    } else {
        for (;;) {
            settle(incount, reqs, 0);
            rc = PMPI_Testsome(incount, reqs, outcount, indices, statuses);
            if (rc != MPI_SUCCESS || *outcount != 0) break;
            sched_yield();
        }
    }
    if (rc == MPI_SUCCESS && *outcount != MPI_UNDEFINED)
        for (int k = 0; k < *outcount; k++) seen_done(&v, indices[k]);
    seen_end(&v);
    return rc;
}

/* The innet state of `comm` for non-blocking `kind` of `bytes`, or NULL (counted) when the
 * call goes to MPI; `r` says the way and whether the call is a timed trial (then nb_watch
 * follows the start). Trials only below MPI_THREAD_MULTIPLE (see the trial table). */
static struct comm_state *nb_served(MPI_Comm comm, int kind, size_t bytes, struct nb_route *r) {
    r->st = NULL;
    r->bits = 0;
    if (!nonblocking_on) {
        innet_mpi_passed(kind, INNET_PASS_DISABLED);
        return NULL;
    }
    struct comm_state *st = served(comm, kind);
    if (!st) return NULL;
    *r = (struct nb_route){st, kind, 0, 0, bytes, {0, 0}};
    r->bits = innet_mpi_route(st->session, kind, bytes,
                              complete_on_progress_thread ? NULL : &r->ticket);
    if (r->bits & INNET_ROUTE_TRIAL) clock_gettime(CLOCK_MONOTONIC, &r->t0);
    return (r->bits & INNET_ROUTE_NETWORK) ? st : NULL;
}

/* The checks of a non-blocking reduction; the innet state when innet serves it. */
static struct comm_state *nb_reduction(MPI_Comm comm, int kind, int count, MPI_Datatype t,
                                       MPI_Op mop, int *op, struct shape *s,
                                       struct nb_route *r) {
    r->st = NULL;
    if (count == 0) {
        innet_mpi_passed(kind, INNET_PASS_EMPTY);
        return NULL;
    }
    *op = op_code(mop);
    if (*op < 0) {
        innet_mpi_passed(kind, INNET_PASS_OP);
        return NULL;
    }
    if (!element_of(t, *op, s)) {
        innet_mpi_passed(kind, INNET_PASS_DATATYPE);
        return NULL;
    }
    return nb_served(comm, kind, (size_t)count * s->stride, r);
}

/* Starts an innet allreduce under a new generalized request in `*request`. A call innet
 * cannot start completes its request at once with MPI_ERR_OTHER (the other ranks are on
 * their way through innet: MPI cannot take it over). */
static int nb_start(struct comm_state *st, MPI_Comm comm, int kind, const void *send,
                    void *recv, size_t count, const struct shape *s, int op,
                    MPI_Request *request) {
    struct nb_call *c = calloc(1, sizeof *c);
    if (!c) {
        st->broken = 1;
        return PMPI_Comm_call_errhandler(comm, MPI_ERR_NO_MEM), MPI_ERR_NO_MEM;
    }
    c->st = st;
    int rc = PMPI_Grequest_start(nb_query, nb_free, nb_cancel, c, request);
    if (rc != MPI_SUCCESS) {
        free(c);
        st->broken = 1;
        return rc;
    }
    c->request = *request;
    if (!complete_on_progress_thread) track(c);
    struct innet_mpi_call call = {kind, op, s->dtype, send, recv, count, s->stride,
                                  s->loc_offset, NULL, 0};
    if (innet_mpi_start_collective(st->session, &call, nb_done, c) != 0) nb_done(c, 1);
    return MPI_SUCCESS;
}

EXPORT int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count,
                          MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                          MPI_Request *request) {
    int code, rc;
    struct shape s;
    struct nb_route r;
    struct comm_state *st =
        nb_reduction(comm, INNET_KIND_IALLREDUCE, count, datatype, op, &code, &s, &r);
    if (!st)
        rc = PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
    else
        rc = nb_start(st, comm, INNET_KIND_IALLREDUCE, sendbuf == MPI_IN_PLACE ? NULL : sendbuf,
                      recvbuf, (size_t)count, &s, code, request);
    if (rc == MPI_SUCCESS) nb_watch(&r, *request);
    return rc;
}

/* MPI_Ireduce as an allreduce whose result only the root keeps. */
EXPORT int MPI_Ireduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
                       MPI_Op op, int root, MPI_Comm comm, MPI_Request *request) {
    int code, rank, rc;
    struct shape s;
    struct nb_route r = {0};
    PMPI_Comm_rank(comm, &rank);
    /* MPI_IN_PLACE off the root is erroneous: MPI reports it. */
    struct comm_state *st =
        rank != root && sendbuf == MPI_IN_PLACE
            ? NULL
            : nb_reduction(comm, INNET_KIND_IREDUCE, count, datatype, op, &code, &s, &r);
    if (!st)
        rc = PMPI_Ireduce(sendbuf, recvbuf, count, datatype, op, root, comm, request);
    else
        rc = nb_start(st, comm, INNET_KIND_IREDUCE, sendbuf == MPI_IN_PLACE ? NULL : sendbuf,
                      rank == root ? recvbuf : NULL, (size_t)count, &s, code, request);
    if (rc == MPI_SUCCESS) nb_watch(&r, *request);
    return rc;
}

/* MPI_Ibcast of a predefined type as a bitwise OR of bytes, the non-roots giving zeros. */
EXPORT int MPI_Ibcast(void *buffer, int count, MPI_Datatype datatype, int root,
                      MPI_Comm comm, MPI_Request *request) {
    int ni, na, nd, combiner, rank, size, rc;
    PMPI_Type_get_envelope(datatype, &ni, &na, &nd, &combiner);
    if (!bcast_on || count == 0 || combiner != MPI_COMBINER_NAMED) {
        innet_mpi_passed(INNET_KIND_IBCAST, !bcast_on ? INNET_PASS_DISABLED
                                            : count == 0 ? INNET_PASS_EMPTY
                                                         : INNET_PASS_DATATYPE);
        return PMPI_Ibcast(buffer, count, datatype, root, comm, request);
    }
    PMPI_Type_size(datatype, &size);
    size_t bytes = (size_t)count * (size_t)size;
    struct nb_route r;
    struct comm_state *st = nb_served(comm, INNET_KIND_IBCAST, bytes, &r);
    if (!st) {
        rc = PMPI_Ibcast(buffer, count, datatype, root, comm, request);
    } else {
        PMPI_Comm_rank(comm, &rank);
        /* The input is copied before nb_start returns; the buffer is MPI's until completion. */
        if (rank != root) memset(buffer, 0, bytes);
        struct shape s = {INNET_U8, 1, 0};
        rc = nb_start(st, comm, INNET_KIND_IBCAST, NULL, buffer, bytes, &s, INNET_OP_BOR,
                      request);
    }
    if (rc == MPI_SUCCESS) nb_watch(&r, *request);
    return rc;
}

EXPORT int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request) {
    if (!barrier_on) {
        innet_mpi_passed(INNET_KIND_IBARRIER, INNET_PASS_DISABLED);
        return PMPI_Ibarrier(comm, request);
    }
    int zero = 0, rc;
    struct nb_route r;
    struct comm_state *st = nb_served(comm, INNET_KIND_IBARRIER, sizeof zero, &r);
    if (!st) {
        rc = PMPI_Ibarrier(comm, request);
    } else {
        struct shape s = {INNET_I32, sizeof(int), 0};
        rc = nb_start(st, comm, INNET_KIND_IBARRIER, &zero, NULL, 1, &s, INNET_OP_SUM,
                      request);
    }
    if (rc == MPI_SUCCESS) nb_watch(&r, *request);
    return rc;
}
