/* The PMPI interposer: MPI_Allreduce, MPI_Reduce, MPI_Bcast, MPI_Barrier, MPI_Allgather and
 * MPI_Reduce_scatter(_block) through innet (the non-blocking collectives: nonblocking.c),
 * everything innet cannot serve handed to the PMPI_ call. Compiled once per MPI
 * implementation (OpenMPI's handles are pointers, MPICH's integers), against its mpi.h, and
 * linked with libinnet_mpi.a, which does the work (innet-mpi/src/abi.rs).
 *
 * The shim does what only C can: MPI's handles, types and ops to innet's codes, attributes,
 * generalized requests, timing. It gives Rust one thing of MPI, an allgather of bytes over
 * a communicator (oob_allgather): over MPI_COMM_WORLD Rust finds the placement at MPI_Init,
 * over a communicator it joins the innet group on the communicator's first intercepted
 * collective and agrees on the learned cutover's decisions.
 *
 * The session is cached as an attribute whose delete callback leaves the group, so
 * MPI_Comm_free and MPI_Finalize tear it down. */
#include <mpi.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

/* innet serves this job (configured, not disabled). */
int active;
/* MPI_Bcast through innet (INNET_MPI_BCAST=0 turns it off: see docs/mpi.md). */
int bcast_on = 1;
/* MPI_Barrier through innet (INNET_MPI_BARRIER=0 turns it off). */
int barrier_on = 1;
static int keyval = MPI_KEYVAL_INVALID;

static struct comm_state *first, *last;
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;

static void unlist(struct comm_state *st) {
    pthread_mutex_lock(&registry);
    if (st->prev) st->prev->next = st->next; else first = st->next;
    if (st->next) st->next->prev = st->prev; else last = st->prev;
    pthread_mutex_unlock(&registry);
}

static int delete_state(MPI_Comm comm, int kv, void *attr, void *extra) {
    (void)comm; (void)kv; (void)extra;
    struct comm_state *st = attr;
    trials_forget(st);
    unlist(st);
    innet_mpi_close(st->session);
    free(st);
    return MPI_SUCCESS;
}

/* struct innet_mpi_oob's allgather: `bytes` from every rank of the communicator `ctx`
 * points to, in rank order. */
static int oob_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
    if (bytes > INT_MAX) return 1;
    return PMPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                          *(MPI_Comm *)ctx) != MPI_SUCCESS;
}

/* A communicator as Rust sees it, its handle at `comm`. */
static struct innet_mpi_oob oob_of(MPI_Comm *comm) {
    struct innet_mpi_oob o = {comm, 0, 0, oob_allgather};
    PMPI_Comm_rank(*comm, &o.rank);
    PMPI_Comm_size(*comm, &o.size);
    return o;
}

static MPI_Comm world_comm;

/* Whether the variable `name` switches something off ("0" or "off"). */
static int switched_off(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcmp(v, "off"));
}

/* Ranks with the same processor name (host name) share a node: Rust finds the placement
 * over MPI_COMM_WORLD with no communicator of our own made at MPI_Init. */
static void start(void) {
    int initialized, len = 0;
    char name[MPI_MAX_PROCESSOR_NAME];
    PMPI_Initialized(&initialized);
    if (!initialized) return;
    bcast_on = !switched_off("INNET_MPI_BCAST");
    barrier_on = !switched_off("INNET_MPI_BARRIER");
    PMPI_Get_processor_name(name, &len);
    world_comm = MPI_COMM_WORLD;
    struct innet_mpi_oob world = oob_of(&world_comm);
    active = innet_mpi_start(&world, name, len);
    if (active &&
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_state, &keyval, NULL) != MPI_SUCCESS)
        active = 0;
}

/* Non-blocking collectives through innet (see "Non-blocking collectives" below), unless
 * INNET_MPI=0 or INNET_MPI_NONBLOCKING=0. */
int nonblocking_on;
/* The application asked for MPI_THREAD_MULTIPLE itself: innet's progress thread may then
 * complete its generalized requests. At any lower level they are completed on the
 * application's own thread, in its MPI_Test and MPI_Wait calls (see settle): innet never
 * asks MPI for a higher thread level than the application did, so MPI_Query_thread tells
 * the truth and MPI's own calls pay no thread-safety locks innet brought in. */
int complete_on_progress_thread;

static void set_thread_level(int provided) {
    nonblocking_on = !switched_off("INNET_MPI") && !switched_off("INNET_MPI_NONBLOCKING");
    complete_on_progress_thread = provided == MPI_THREAD_MULTIPLE;
}

EXPORT int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) {
        int provided = MPI_THREAD_SINGLE;
        PMPI_Query_thread(&provided);
        set_thread_level(provided);
        start();
    }
    return rc;
}

EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) {
        set_thread_level(*provided);
        start();
    }
    return rc;
}

/* Joins innet for `comm` (collective over `comm`): Rust draws the group id, joins and
 * agrees with the other ranks over the communicator's allgather. */
static struct comm_state *join(MPI_Comm comm) {
    struct comm_state *st = calloc(1, sizeof *st);
    if (!st) {
        /* The join is collective: this rank takes part and refuses (no ranks), so every
         * rank refuses. */
        MPI_Comm c = comm;
        struct innet_mpi_oob o = oob_of(&c);
        if (o.size > 1) innet_mpi_close(innet_mpi_open(&o, NULL));
        return NULL;
    }
    st->comm = comm;
    st->oob = oob_of(&st->comm);
    int size = st->oob.size;
    if (size > 1) {
        /* Every rank calls innet_mpi_open (collective), one without memory for the
         * translation with no ranks, which it refuses: the others then refuse too. */
        MPI_Group group, world;
        int *ranks = malloc(2 * sizeof(int) * (size_t)size);
        if (ranks) {
            for (int i = 0; i < size; i++) ranks[i] = i;
            PMPI_Comm_group(comm, &group);
            PMPI_Comm_group(MPI_COMM_WORLD, &world);
            PMPI_Group_translate_ranks(group, size, ranks, world, ranks + size);
            PMPI_Group_free(&group);
            PMPI_Group_free(&world);
        }
        st->session = innet_mpi_open(&st->oob, ranks ? ranks + size : NULL);
        free(ranks);
    }
    pthread_mutex_lock(&registry);
    st->prev = last;
    if (last) last->next = st; else first = st;
    last = st;
    pthread_mutex_unlock(&registry);
    PMPI_Comm_set_attr(comm, keyval, st);
    return st;
}

/* The innet state of `comm` for a collective of `kind`, or NULL (counted) when the
 * collective goes to MPI. */
struct comm_state *served(MPI_Comm comm, int kind) {
    if (!active) {
        innet_mpi_passed(kind, INNET_PASS_DISABLED);
        return NULL;
    }
    int inter = 0;
    PMPI_Comm_test_inter(comm, &inter);
    if (inter) {
        innet_mpi_passed(kind, INNET_PASS_INTERCOMMUNICATOR);
        return NULL;
    }
    struct comm_state *st = NULL;
    int found = 0;
    PMPI_Comm_get_attr(comm, keyval, &st, &found);
    if (!found) st = join(comm);
    if (!st || !st->session || st->broken) {
        innet_mpi_passed(kind, INNET_PASS_COMMUNICATOR);
        return NULL;
    }
    return st;
}

int op_code(MPI_Op op) {
    if (op == MPI_SUM) return INNET_OP_SUM;
    if (op == MPI_PROD) return INNET_OP_PROD;
    if (op == MPI_MIN) return INNET_OP_MIN;
    if (op == MPI_MAX) return INNET_OP_MAX;
    if (op == MPI_BAND) return INNET_OP_BAND;
    if (op == MPI_BOR) return INNET_OP_BOR;
    if (op == MPI_BXOR) return INNET_OP_BXOR;
    if (op == MPI_LAND) return INNET_OP_LAND;
    if (op == MPI_LOR) return INNET_OP_LOR;
    if (op == MPI_LXOR) return INNET_OP_LXOR;
    if (op == MPI_MINLOC) return INNET_OP_MINLOC;
    if (op == MPI_MAXLOC) return INNET_OP_MAXLOC;
    return -1; /* user-defined (possibly non-commutative), MPI_REPLACE, MPI_NO_OP */
}

/* A single-value type: its innet code and C type class (integer, float, byte, bool). */
enum class_ { INTEGER, FLOAT, BYTE, BOOL };
static int value_code(MPI_Datatype t, enum class_ *cls) {
    *cls = INTEGER;
    if (t == MPI_SIGNED_CHAR || t == MPI_INT8_T) return INNET_I8;
    if (t == MPI_UNSIGNED_CHAR || t == MPI_UINT8_T) return INNET_U8;
    if (t == MPI_SHORT || t == MPI_INT16_T) return INNET_I16;
    if (t == MPI_UNSIGNED_SHORT || t == MPI_UINT16_T) return INNET_U16;
    if (t == MPI_INT || t == MPI_INT32_T) return INNET_I32;
    if (t == MPI_UNSIGNED || t == MPI_UINT32_T) return INNET_U32;
    if (t == MPI_INT64_T || t == MPI_LONG_LONG || t == MPI_LONG_LONG_INT || t == MPI_AINT ||
        t == MPI_OFFSET || t == MPI_COUNT || (t == MPI_LONG && sizeof(long) == 8))
        return INNET_I64;
    if (t == MPI_UINT64_T || t == MPI_UNSIGNED_LONG_LONG ||
        (t == MPI_UNSIGNED_LONG && sizeof(unsigned long) == 8))
        return INNET_U64;
    if (t == MPI_LONG && sizeof(long) == 4) return INNET_I32;
    if (t == MPI_UNSIGNED_LONG && sizeof(unsigned long) == 4) return INNET_U32;
    *cls = FLOAT;
    if (t == MPI_FLOAT) return INNET_F32;
    if (t == MPI_DOUBLE) return INNET_F64;
#ifdef MPIX_C_FLOAT16
    /* IEEE binary16 (MPICH ≥ 4.0). MPI names no bfloat16 type: INNET_BF16 has no MPI
     * source, and an MPI without MPIX_C_FLOAT16 (Open MPI 4.1) reduces its halves itself. */
    if (t == MPIX_C_FLOAT16) return INNET_F16;
#endif
    *cls = BYTE;
    if (t == MPI_BYTE) return INNET_U8;
    *cls = BOOL;
    if (t == MPI_C_BOOL && sizeof(_Bool) == 1) return INNET_U8;
    return -1;
}


/* The innet element of `t` under `op`, as MPI defines the pair (MPI-4.1 §6.9): false when
 * innet does not reduce it (the call then goes to MPI, which also reports invalid pairs). */
int element_of(MPI_Datatype t, int op, struct shape *s) {
    if (op == INNET_OP_MINLOC || op == INNET_OP_MAXLOC) {
#define PAIR(mpi, ctype, code)                                                                  \
    if (t == mpi) {                                                                             \
        struct p { ctype v; int loc; };                                                         \
        *s = (struct shape){code, sizeof(struct p), offsetof(struct p, loc)};                   \
        return 1;                                                                               \
    }
        PAIR(MPI_2INT, int, INNET_I32)
        PAIR(MPI_FLOAT_INT, float, INNET_F32)
        PAIR(MPI_DOUBLE_INT, double, INNET_F64)
        PAIR(MPI_SHORT_INT, short, INNET_I16)
        PAIR(MPI_LONG_INT, long, sizeof(long) == 8 ? INNET_I64 : INNET_I32)
#undef PAIR
        return 0;
    }
    enum class_ cls;
    int code = value_code(t, &cls);
    if (code < 0) return 0;
    int bitwise = op == INNET_OP_BAND || op == INNET_OP_BOR || op == INNET_OP_BXOR;
    int logical = op == INNET_OP_LAND || op == INNET_OP_LOR || op == INNET_OP_LXOR;
    if ((cls == FLOAT && (bitwise || logical)) || (cls == BYTE && !bitwise) ||
        (cls == BOOL && !logical))
        return 0;
    int size;
    PMPI_Type_size(t, &size);
    *s = (struct shape){code, (size_t)size, 0};
    return 1;
}

/* The outcome of an innet call (0: done): a failure marks the communicator broken and
 * goes through its error handler, as a failed MPI call would. */
static int innet_outcome(int failed, struct comm_state *st, MPI_Comm comm) {
    if (!failed) return MPI_SUCCESS;
    st->broken = 1;
    PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* Runs an allreduce through innet. */
static int through_innet(struct comm_state *st, MPI_Comm comm, int kind, const void *send,
                         void *recv, size_t count, const struct shape *s, int op) {
    struct innet_mpi_call c = {kind, op, s->dtype, send, recv, count, s->stride, s->loc_offset,
                               NULL, 0};
    return innet_outcome(innet_mpi_collective(st->session, &c), st, comm);
}

/* One call's way: through innet or to MPI, and whether it is timed for the learned
 * cutover (then learn_done follows it). */
struct route {
    struct comm_state *st; /* NULL: MPI, not part of a trial */
    int bits;              /* INNET_ROUTE_* */
    size_t bytes;
    struct timespec t0;
};

static void route_for(struct route *r, struct comm_state *st, int kind, size_t bytes) {
    r->st = st;
    r->bytes = bytes;
    r->bits = st ? innet_mpi_route(st->session, kind, bytes, NULL) : 0;
    if (r->bits & INNET_ROUTE_TRIAL) clock_gettime(CLOCK_MONOTONIC, &r->t0);
}

static int through_network(const struct route *r) {
    return r->st && (r->bits & INNET_ROUTE_NETWORK);
}

/* After a call: a trial call's time goes to the learner; at the end of a trial's round the
 * ranks agree in it (the same call on every rank, so its allgather matches). */
static void learn_done(const struct route *r, int kind) {
    if (!r->st || !(r->bits & INNET_ROUTE_TRIAL)) return;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t ns = (uint64_t)(t1.tv_sec - r->t0.tv_sec) * 1000000000u +
                  (uint64_t)(t1.tv_nsec - r->t0.tv_nsec);
    innet_mpi_took(r->st->session, kind, r->bytes, 0, ns);
}

/* The innet state of `comm` if it has joined, without joining or counting a call (NULL
 * otherwise). */
static struct comm_state *joined(MPI_Comm comm) {
    struct comm_state *st = NULL;
    int found = 0;
    if (!active) return NULL;
    PMPI_Comm_get_attr(comm, keyval, &st, &found);
    return found && st && st->session && !st->broken ? st : NULL;
}

/* Where every rank of the communicator is anyway (after a blocking MPI_Allreduce or
 * MPI_Barrier the application called): the ranks agree on a non-blocking size class whose
 * trial calls are all started, if any (innet-client/src/policy/learn/started.rs). Waiting
 * here cannot deadlock a program that the collective itself does not. */
static void nb_agree(struct comm_state *st) {
    if (st && st->session) innet_mpi_agree(st->session);
}

/* The checks every reduction makes; the route says where the call goes (counted). */
static void reduction(struct route *r, MPI_Comm comm, int kind, int count, MPI_Datatype t,
                      MPI_Op mop, int *op, struct shape *s) {
    route_for(r, NULL, kind, 0);
    if (count == 0) {
        innet_mpi_passed(kind, INNET_PASS_EMPTY);
        return;
    }
    *op = op_code(mop);
    if (*op < 0) {
        innet_mpi_passed(kind, INNET_PASS_OP);
        return;
    }
    if (!element_of(t, *op, s)) {
        innet_mpi_passed(kind, INNET_PASS_DATATYPE);
        return;
    }
    struct comm_state *st = served(comm, kind);
    if (st) route_for(r, st, kind, (size_t)count * s->stride);
}

EXPORT int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
                         MPI_Op op, MPI_Comm comm) {
    int code, rc;
    struct shape s;
    struct route r;
    reduction(&r, comm, INNET_KIND_ALLREDUCE, count, datatype, op, &code, &s);
    if (!through_network(&r))
        rc = PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    else
        rc = through_innet(r.st, comm, INNET_KIND_ALLREDUCE,
                           sendbuf == MPI_IN_PLACE ? NULL : sendbuf, recvbuf, (size_t)count, &s,
                           code);
    learn_done(&r, INNET_KIND_ALLREDUCE);
    nb_agree(r.st);
    return rc;
}

/* MPI_Reduce as an allreduce whose result only the root keeps. */
EXPORT int MPI_Reduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
                      MPI_Op op, int root, MPI_Comm comm) {
    int code, rc, rank;
    struct shape s;
    struct route r;
    reduction(&r, comm, INNET_KIND_REDUCE, count, datatype, op, &code, &s);
    PMPI_Comm_rank(comm, &rank);
    if (!through_network(&r)) {
        rc = PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm);
    } else if (rank == root) {
        rc = through_innet(r.st, comm, INNET_KIND_REDUCE,
                           sendbuf == MPI_IN_PLACE ? NULL : sendbuf, recvbuf, (size_t)count, &s,
                           code);
    } else {
        /* The other ranks are on their way through innet: no memory fails the call. */
        void *scratch = malloc((size_t)count * s.stride);
        if (!scratch) {
            r.st->broken = 1;
            return PMPI_Comm_call_errhandler(comm, MPI_ERR_NO_MEM), MPI_ERR_NO_MEM;
        }
        rc = through_innet(r.st, comm, INNET_KIND_REDUCE, sendbuf, scratch, (size_t)count, &s,
                           code);
        free(scratch);
    }
    learn_done(&r, INNET_KIND_REDUCE);
    return rc;
}

/* MPI_Bcast of a predefined type as a bitwise OR of bytes, the non-roots giving zeros. */
EXPORT int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
    int ni, na, nd, combiner;
    PMPI_Type_get_envelope(datatype, &ni, &na, &nd, &combiner);
    if (!bcast_on || count == 0 || combiner != MPI_COMBINER_NAMED) {
        innet_mpi_passed(INNET_KIND_BCAST, !bcast_on ? INNET_PASS_DISABLED
                                           : count == 0 ? INNET_PASS_EMPTY
                                                        : INNET_PASS_DATATYPE);
        return PMPI_Bcast(buffer, count, datatype, root, comm);
    }
    struct comm_state *st = served(comm, INNET_KIND_BCAST);
    if (!st) return PMPI_Bcast(buffer, count, datatype, root, comm);
    int rank, size, rc;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Type_size(datatype, &size);
    size_t bytes = (size_t)count * (size_t)size;
    struct route r;
    route_for(&r, st, INNET_KIND_BCAST, bytes);
    if (!through_network(&r)) {
        rc = PMPI_Bcast(buffer, count, datatype, root, comm);
    } else {
        if (rank != root) memset(buffer, 0, bytes);
        struct shape s = {INNET_U8, 1, 0};
        rc = through_innet(st, comm, INNET_KIND_BCAST, NULL, buffer, bytes, &s, INNET_OP_BOR);
    }
    learn_done(&r, INNET_KIND_BCAST);
    return rc;
}

EXPORT int MPI_Barrier(MPI_Comm comm) {
    if (!barrier_on) {
        innet_mpi_passed(INNET_KIND_BARRIER, INNET_PASS_DISABLED);
        int rc = PMPI_Barrier(comm);
        /* Still a point every rank reaches: the non-blocking kinds agree here too. */
        nb_agree(joined(comm));
        return rc;
    }
    struct comm_state *st = served(comm, INNET_KIND_BARRIER);
    if (!st) return PMPI_Barrier(comm);
    int zero = 0, rc;
    struct shape s = {INNET_I32, sizeof(int), 0};
    /* A barrier's trial sample runs from its entry to the next barrier's (Learner::spanning
     * in innet-client/src/policy/learn.rs): what its release costs the calls after it is its too. */
    if (st->barrier_span) {
        struct route span = {st, INNET_ROUTE_TRIAL, sizeof zero, st->barrier_t0};
        learn_done(&span, INNET_KIND_BARRIER);
    }
    struct route r;
    route_for(&r, st, INNET_KIND_BARRIER, sizeof zero);
    st->barrier_span = r.bits & INNET_ROUTE_TRIAL;
    st->barrier_t0 = r.t0;
    if (!through_network(&r))
        rc = PMPI_Barrier(comm);
    else
        rc = through_innet(st, comm, INNET_KIND_BARRIER, NULL, &zero, 1, &s, INNET_OP_SUM);
    nb_agree(st);
    return rc;
}

/* The bytes of `count` elements of `t` when they lie packed in memory (a predefined type
 * whose extent is its size: no gaps, no padding pairs), else 0 with *ok cleared. */
static size_t packed_bytes(MPI_Datatype t, int count, int *ok) {
    int ni, na, nd, combiner, size;
    MPI_Aint lb, extent;
    PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner);
    PMPI_Type_size(t, &size);
    PMPI_Type_get_extent(t, &lb, &extent);
    if (combiner != MPI_COMBINER_NAMED || lb != 0 || extent != size || count < 0) {
        *ok = 0;
        return 0;
    }
    return (size_t)count * (size_t)size;
}

/* MPI_Allgather of packed blocks as a bitwise OR of bytes: each rank gives zeros but for
 * its own block at its offset (innet-mpi lays them out). */
EXPORT int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
                         void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
    int ok = 1, in_place = sendbuf == MPI_IN_PLACE;
    size_t block = packed_bytes(recvtype, recvcount, &ok);
    if (!in_place && packed_bytes(sendtype, sendcount, &ok) != block) ok = 0;
    if (!ok || block == 0) {
        innet_mpi_passed(INNET_KIND_ALLGATHER, ok ? INNET_PASS_EMPTY : INNET_PASS_DATATYPE);
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    }
    struct comm_state *st = served(comm, INNET_KIND_ALLGATHER);
    if (!st)
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    int rc;
    struct route r;
    route_for(&r, st, INNET_KIND_ALLGATHER, block); /* learned per block size, as MPI sizes it */
    if (!through_network(&r))
        rc = PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    else
    {
        struct innet_mpi_call c = {INNET_KIND_ALLGATHER, 0, 0, in_place ? NULL : sendbuf,
                                   recvbuf, 0, 0, 0, NULL, block};
        rc = innet_outcome(innet_mpi_collective(st->session, &c), st, comm);
    }
    learn_done(&r, INNET_KIND_ALLGATHER);
    return rc;
}

/* A reduce-scatter of `total` elements (an allreduce of which each rank keeps its part):
 * `counts` one per rank, or NULL for `block` each. */
static int reduce_scatter(struct route *r, MPI_Comm comm, int kind, const void *sendbuf,
                          void *recvbuf, const int *counts, int block, long long total,
                          MPI_Datatype datatype, MPI_Op op) {
    int code = 0;
    struct shape s = {0};
    if (total > INT_MAX) {
        route_for(r, NULL, kind, 0);
        innet_mpi_passed(kind, INNET_PASS_DATATYPE);
    } else {
        reduction(r, comm, kind, (int)total, datatype, op, &code, &s);
    }
    if (!through_network(r)) return -1;
    struct innet_mpi_call c = {kind, code, s.dtype, sendbuf == MPI_IN_PLACE ? NULL : sendbuf,
                               recvbuf, 0, s.stride, s.loc_offset, counts, (size_t)block};
    return innet_outcome(innet_mpi_collective(r->st->session, &c), r->st, comm);
}

EXPORT int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
                                    MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
    int size, kind = INNET_KIND_REDUCE_SCATTER_BLOCK;
    PMPI_Comm_size(comm, &size);
    struct route r;
    int rc = reduce_scatter(&r, comm, kind, sendbuf, recvbuf, NULL, recvcount,
                            (long long)recvcount * size, datatype, op);
    if (rc < 0) rc = PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
    learn_done(&r, kind);
    return rc;
}

EXPORT int MPI_Reduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[],
                              MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
    int size, kind = INNET_KIND_REDUCE_SCATTER;
    PMPI_Comm_size(comm, &size);
    long long total = 0;
    for (int i = 0; i < size; i++) total += recvcounts[i] > 0 ? recvcounts[i] : 0;
    struct route r;
    int rc = reduce_scatter(&r, comm, kind, sendbuf, recvbuf, recvcounts, 0, total, datatype, op);
    if (rc < 0) rc = PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm);
    learn_done(&r, kind);
    return rc;
}

/* Leaves every group before MPI goes: MPI_COMM_WORLD's and MPI_COMM_SELF's attributes, then
 * the communicators the program never freed, in creation order (the same on every rank). */
EXPORT int MPI_Finalize(void) {
    if (active) {
        MPI_Comm builtin[2] = {MPI_COMM_WORLD, MPI_COMM_SELF};
        for (int i = 0; i < 2; i++) {
            void *attr;
            int found = 0;
            PMPI_Comm_get_attr(builtin[i], keyval, &attr, &found);
            if (found) PMPI_Comm_delete_attr(builtin[i], keyval);
        }
        for (;;) {
            pthread_mutex_lock(&registry);
            struct comm_state *st = first;
            pthread_mutex_unlock(&registry);
            if (!st) break;
            unlist(st);
            innet_mpi_close(st->session);
            st->session = NULL; /* the attribute's delete callback may still run */
            st->prev = st->next = NULL;
        }
        PMPI_Comm_free_keyval(&keyval);
        active = 0;
    }
    innet_mpi_finish(); /* the report, also of a job innet did not serve */
    return PMPI_Finalize();
}
