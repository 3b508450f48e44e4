/* The C ABI of libinnet_mpi (innet-mpi/src/lib.rs). The codes are innet_common's
 * Op/Dtype values and innet-mpi's report indices; a Rust test checks this file against
 * them. */
#ifndef INNET_MPI_H
#define INNET_MPI_H

#include <stddef.h>
#include <stdint.h>

/* innet_common::proto::Op */
enum {
    INNET_OP_SUM = 0,
    INNET_OP_PROD = 1,
    INNET_OP_MIN = 2,
    INNET_OP_MAX = 3,
    INNET_OP_BAND = 4,
    INNET_OP_BOR = 5,
    INNET_OP_BXOR = 6,
    INNET_OP_LAND = 7,
    INNET_OP_LOR = 8,
    INNET_OP_LXOR = 9,
    INNET_OP_MINLOC = 10,
    INNET_OP_MAXLOC = 11,
};

/* innet_common::proto::Dtype */
enum {
    INNET_I8 = 0,
    INNET_I16 = 1,
    INNET_I32 = 2,
    INNET_I64 = 3,
    INNET_U8 = 4,
    INNET_U16 = 5,
    INNET_U32 = 6,
    INNET_U64 = 7,
    INNET_F32 = 8,
    INNET_F64 = 9,
    INNET_F16 = 10,
    INNET_BF16 = 11,
};

/* innet_mpi::report::KINDS */
enum {
    INNET_KIND_ALLREDUCE = 0,
    INNET_KIND_REDUCE = 1,
    INNET_KIND_BCAST = 2,
    INNET_KIND_BARRIER = 3,
    INNET_KIND_IALLREDUCE = 4,
    INNET_KIND_IREDUCE = 5,
    INNET_KIND_IBCAST = 6,
    INNET_KIND_IBARRIER = 7,
    INNET_KIND_ALLGATHER = 8,
    INNET_KIND_REDUCE_SCATTER_BLOCK = 9,
    INNET_KIND_REDUCE_SCATTER = 10,
};

/* innet_mpi::report::PASS_REASONS */
enum {
    INNET_PASS_DISABLED = 0,
    INNET_PASS_OP = 1,
    INNET_PASS_DATATYPE = 2,
    INNET_PASS_COMMUNICATOR = 3,
    INNET_PASS_INTERCOMMUNICATOR = 4,
    INNET_PASS_EMPTY = 5,
    INNET_PASS_CUTOVER = 6,
    INNET_PASS_ERROR = 7,
    INNET_PASS_LEARNING = 8,
};

/* innet_mpi_route's bits (innet_mpi::ROUTE_*) */
enum {
    INNET_ROUTE_NETWORK = 1,
    INNET_ROUTE_TRIAL = 2,
};

/* innet_mpi::discover::Record: what each rank tells the others when the interposer finds
 * the placement (addresses in host order, 0 for none). */
enum {
    INNET_RECORD_WORDS = 3,
};
struct innet_mpi_record {
    uint32_t node; /* the world rank that speaks for the rank's node */
    uint32_t ip;   /* the node's INC address */
    uint32_t tor;  /* its TOR's address, from the probe */
};

/* 0: off; 1: a file places the ranks; 2: find the placement (the calls below). */
int innet_mpi_start(int world_rank, int world_size);
uint64_t innet_mpi_node_key(const char *name, int len);
uint32_t innet_mpi_node_leader(int rank, int size, const uint64_t *keys);
int innet_mpi_node_address(uint32_t *ip);
uint32_t innet_mpi_probe_tor(uint32_t own, int size, const struct innet_mpi_record *records);
int innet_mpi_placed(int size, const struct innet_mpi_record *records);
uint64_t innet_mpi_new_job(void);
void *innet_mpi_open(uint64_t job, int rank, int size, const int *members);
void innet_mpi_close(void *session);
int innet_mpi_allreduce(void *session, int kind, const void *send, void *recv, size_t count,
                        size_t stride, size_t loc_offset, int op, int dtype);
int innet_mpi_allgather(void *session, const void *send, void *recv, size_t block);
int innet_mpi_reduce_scatter(void *session, int kind, const void *send, void *recv,
                             const int *counts, size_t block, size_t stride, size_t loc_offset,
                             int op, int dtype);
void innet_mpi_passed(int kind, int reason);
int innet_mpi_route(void *session, int kind, size_t bytes);
int innet_mpi_took(void *session, int kind, size_t bytes, uint64_t nanos);
void innet_mpi_medians(void *session, int kind, size_t bytes, double out[2]);
void innet_mpi_decide(void *session, int kind, size_t bytes, double network_us, double mpi_us);
/* Non-blocking collectives (innet_mpi::nonblocking): the way of a call (INNET_ROUTE_*
 * bits, MPI's counted; `ticket` NULL: no trials, else a timed trial call's ticket, with
 * INNET_ROUTE_TRIAL), and its start: 0 when started, `done(arg, failed)` then runs once when
 * it is over, on innet's progress thread; 1 when it could not start (done does not run).
 * A trial call's start-to-completion time goes to nb_took; in a blocking collective every
 * rank calls nb_due and, when it says 1, sums the four doubles over the ranks and calls
 * nb_decide with the sums. */
int innet_mpi_nb_route(void *session, int kind, size_t bytes, uint32_t *ticket);
int innet_mpi_iallreduce(void *session, int kind, const void *send, void *recv, size_t count,
                         size_t stride, size_t loc_offset, int op, int dtype,
                         void (*done)(void *arg, int failed), void *arg);
void innet_mpi_nb_took(void *session, int kind, size_t bytes, uint32_t ticket, uint64_t nanos);
int innet_mpi_nb_due(void *session, int *kind, size_t *bytes, double part[4]);
void innet_mpi_nb_decide(void *session, int kind, size_t bytes, const double sums[4]);
/* The application's thread waits (`wait` 1) or tests (0) for a started call of `session`:
 * runs the started calls there unless innet's progress thread has taken them (a test only
 * when their results are at the socket already). */
void innet_mpi_progress(void *session, int wait);
void innet_mpi_finish(void);

#endif
