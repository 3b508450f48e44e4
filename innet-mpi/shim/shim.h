/* What the shim's files share (innet_mpi.c: MPI_Init, joining, the blocking collectives;
 * nonblocking.c: the non-blocking collectives and the MPI_Test and MPI_Wait forms;
 * trials.c: their timed trial calls). Every
 * symbol stays inside the library (-fvisibility=hidden): only EXPORT ones leave it. */
#ifndef INNET_SHIM_H
#define INNET_SHIM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "innet_mpi.h" /* generated from Rust (innet-mpi/src/header.rs) by cargo xtask build */

#define EXPORT __attribute__((visibility("default")))

/* One communicator's state, cached as an attribute and listed in creation order. */
struct comm_state {
    void *session; /* NULL: innet does not serve this communicator */
    MPI_Comm comm;              /* the communicator, which oob.ctx points to */
    struct innet_mpi_oob oob;   /* its allgather, for Rust */
    _Atomic int broken; /* an innet call failed: the rest go to MPI (set by innet's
                         * progress thread too, see nb_done) */
    int barrier_span;      /* the last barrier was a trial call: its sample ends at the next */
    struct timespec barrier_t0;
    struct comm_state *prev, *next;
};

/* innet serves this job (configured, not disabled). */
extern int active;
/* MPI_Bcast and MPI_Barrier through innet (INNET_MPI_BCAST=0, INNET_MPI_BARRIER=0). */
extern int bcast_on, barrier_on;
/* Non-blocking collectives through innet, and who completes their generalized requests
 * (innet_mpi.c, set_thread_level). */
extern int nonblocking_on, complete_on_progress_thread;

/* The innet state of `comm` for a collective of `kind`, or NULL (counted) when the
 * collective goes to MPI. */
struct comm_state *served(MPI_Comm comm, int kind);

/* An MPI reduction's innet op code, or -1. */
int op_code(MPI_Op op);

/* One innet element of an MPI type under an op: its innet type, stride and, for a
 * location pair, the location's offset. */
struct shape { int dtype; size_t stride, loc_offset; };
int element_of(MPI_Datatype t, int op, struct shape *s);

/* The non-blocking kinds' timed trial calls (trials.c). */
/* A non-blocking call's way. */
struct nb_route {
    struct comm_state *st; /* NULL: the communicator is not innet's */
    int kind, bits;        /* INNET_KIND_*, INNET_ROUTE_* */
    uint32_t ticket;
    size_t bytes;
    struct timespec t0;
};
void nb_watch(const struct nb_route *r, MPI_Request request);
/* Forgets the non-blocking trial calls of a communicator that goes. */
void trials_forget(const struct comm_state *st);
/* The handles a Wait or Test form was given, kept before MPI frees them, when a trial
 * call may be among them. */
struct seen {
    MPI_Request *before, local[16];
    int n;
};
void seen_begin(struct seen *v, int n, const MPI_Request *reqs);
void seen_done(struct seen *v, int i);
void seen_end(struct seen *v);

#endif
