/* The PMPI interposer: MPI_Allreduce, MPI_Reduce, MPI_Bcast, MPI_Barrier, MPI_Allgather and
 * MPI_Reduce_scatter(_block) through innet,
 * everything innet cannot serve handed to the PMPI_ call. Compiled once per MPI
 * implementation (OpenMPI's handles are pointers, MPICH's integers), against its mpi.h, and
 * linked with libinnet_mpi.a, which does the work (innet-mpi/src/lib.rs).
 *
 * Without a placement file, MPI_Init finds the placement (discover): ranks with one
 * processor name share a node, each rank finds its node's INC address, each node's lowest
 * rank probes its TOR, and every rank gathers what every other rank found.
 *
 * Without a cutover table, each communicator learns which way is faster per collective and
 * size class (timed trials of both ways, decided on the ranks' mean times: learn_done).
 *
 * A communicator joins an innet group on its first intercepted collective: its rank 0
 * draws a group id and broadcasts it, every rank joins, and the ranks agree (a MIN
 * allreduce) that all of them did, else none uses innet on it. The session is cached as an
 * attribute whose delete callback leaves the group, so MPI_Comm_free and MPI_Finalize
 * tear it down. */
#include <mpi.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "innet_mpi.h"

#define EXPORT __attribute__((visibility("default")))

/* innet serves this job (configured, not disabled). */
static int active;
/* MPI_Bcast through innet (INNET_MPI_BCAST=0 turns it off: see docs/mpi.md). */
static int bcast_on = 1;
/* MPI_Barrier through innet (INNET_MPI_BARRIER=0 turns it off). */
static int barrier_on = 1;
static int keyval = MPI_KEYVAL_INVALID;

/* One communicator's state, cached as an attribute and listed in creation order. */
struct comm_state {
    void *session; /* NULL: innet does not serve this communicator */
    _Atomic int broken; /* an innet call failed: the rest go to MPI (set by innet's
                         * progress thread too, see nb_done) */
    int barrier_span;      /* the last barrier was a trial call: its sample ends at the next */
    struct timespec barrier_t0;
    struct comm_state *prev, *next;
};
static struct comm_state *first, *last;
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;

static void unlist(struct comm_state *st) {
    pthread_mutex_lock(&registry);
    if (st->prev) st->prev->next = st->next; else first = st->next;
    if (st->next) st->next->prev = st->prev; else last = st->prev;
    pthread_mutex_unlock(&registry);
}

static void trials_forget(const struct comm_state *st);

static int delete_state(MPI_Comm comm, int kv, void *attr, void *extra) {
    (void)comm; (void)kv; (void)extra;
    struct comm_state *st = attr;
    trials_forget(st);
    unlist(st);
    innet_mpi_close(st->session);
    free(st);
    return MPI_SUCCESS;
}

/* Finds the placement (collective over MPI_COMM_WORLD): 1 when innet serves the job.
 * Ranks with the same processor name (host name) share a node: no communicator of our
 * own is made at MPI_Init for it. */
static int discover(int rank, int size) {
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    PMPI_Get_processor_name(name, &len);
    uint64_t key = innet_mpi_node_key(name, len);
    uint64_t *keys = calloc((size_t)size, sizeof *keys);
    struct innet_mpi_record *all = calloc((size_t)size, sizeof *all);
    int ok = keys && all, everyone = 0;
    PMPI_Allreduce(&ok, &everyone, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!everyone) {
        free(keys);
        free(all);
        return 0;
    }
    PMPI_Allgather(&key, 1, MPI_UINT64_T, keys, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    struct innet_mpi_record me = {innet_mpi_node_leader(rank, size, keys), 0, 0};
    free(keys);
    innet_mpi_node_address(&me.ip);
    PMPI_Allgather(&me, INNET_RECORD_WORDS, MPI_UINT32_T, all, INNET_RECORD_WORDS,
                   MPI_UINT32_T, MPI_COMM_WORLD);
    /* The node's lowest rank probes its TOR; the node's record is that rank's. */
    if (me.node == (uint32_t)rank) me.tor = innet_mpi_probe_tor(me.ip, size, all);
    PMPI_Allgather(&me, INNET_RECORD_WORDS, MPI_UINT32_T, all, INNET_RECORD_WORDS,
                   MPI_UINT32_T, MPI_COMM_WORLD);
    int on = innet_mpi_placed(size, all);
    free(all);
    return on;
}

/* Whether the variable `name` switches something off ("0" or "off"). */
static int switched_off(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcmp(v, "off"));
}

static void start(void) {
    int rank, size, initialized;
    PMPI_Initialized(&initialized);
    if (!initialized) return;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    bcast_on = !switched_off("INNET_MPI_BCAST");
    barrier_on = !switched_off("INNET_MPI_BARRIER");
    active = innet_mpi_start(rank, size);
    if (active == 2) active = discover(rank, size);
    if (active &&
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_state, &keyval, NULL) != MPI_SUCCESS)
        active = 0;
}

/* Non-blocking collectives through innet (see "Non-blocking collectives" below), unless
 * INNET_MPI=0 or INNET_MPI_NONBLOCKING=0. */
static int nonblocking_on;
/* The application asked for MPI_THREAD_MULTIPLE itself: innet's progress thread may then
 * complete its generalized requests. At any lower level they are completed on the
 * application's own thread, in its MPI_Test and MPI_Wait calls (see settle): innet never
 * asks MPI for a higher thread level than the application did, so MPI_Query_thread tells
 * the truth and MPI's own calls pay no thread-safety locks innet brought in. */
static int complete_on_progress_thread;

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

/* Joins innet for `comm` (collective over `comm`). */
static struct comm_state *join(MPI_Comm comm) {
    int rank, size;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    struct comm_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    if (size > 1) {
        uint64_t job = rank == 0 ? innet_mpi_new_job() : 0;
        PMPI_Bcast(&job, 1, MPI_UINT64_T, 0, comm);
        MPI_Group group, world;
        int *ranks = malloc(2 * sizeof(int) * (size_t)size);
        if (ranks) {
            for (int i = 0; i < size; i++) ranks[i] = i;
            PMPI_Comm_group(comm, &group);
            PMPI_Comm_group(MPI_COMM_WORLD, &world);
            PMPI_Group_translate_ranks(group, size, ranks, world, ranks + size);
            PMPI_Group_free(&group);
            PMPI_Group_free(&world);
            st->session = innet_mpi_open(job, rank, size, ranks + size);
            free(ranks);
        }
        int joined = st->session != NULL, all = 0;
        PMPI_Allreduce(&joined, &all, 1, MPI_INT, MPI_MIN, comm);
        if (!all && st->session) {
            innet_mpi_close(st->session);
            st->session = NULL;
        }
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
static struct comm_state *served(MPI_Comm comm, int kind) {
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

static int op_code(MPI_Op op) {
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

struct shape { int dtype; size_t stride, loc_offset; };

/* The innet element of `t` under `op`, as MPI defines the pair (MPI-4.1 §6.9): false when
 * innet does not reduce it (the call then goes to MPI, which also reports invalid pairs). */
static int element_of(MPI_Datatype t, int op, struct shape *s) {
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
    return innet_outcome(innet_mpi_allreduce(st->session, kind, send, recv, count, s->stride,
                                             s->loc_offset, op, s->dtype),
                         st, comm);
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
    r->bits = st ? innet_mpi_route(st->session, kind, bytes) : 0;
    if (r->bits & INNET_ROUTE_TRIAL) clock_gettime(CLOCK_MONOTONIC, &r->t0);
}

static int through_network(const struct route *r) {
    return r->st && (r->bits & INNET_ROUTE_NETWORK);
}

/* After a call: a trial call's time goes to the learner; when the trial is over, the ranks
 * sum their median times per way (the same call on every rank, so the allreduce matches)
 * and every rank decides on the sums. */
static void learn_done(const struct route *r, MPI_Comm comm, int kind) {
    if (!r->st || !(r->bits & INNET_ROUTE_TRIAL)) return;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t ns = (uint64_t)(t1.tv_sec - r->t0.tv_sec) * 1000000000u +
                  (uint64_t)(t1.tv_nsec - r->t0.tv_nsec);
    if (!innet_mpi_took(r->st->session, kind, r->bytes, ns)) return;
    double medians[2];
    innet_mpi_medians(r->st->session, kind, r->bytes, medians);
    PMPI_Allreduce(MPI_IN_PLACE, medians, 2, MPI_DOUBLE, MPI_SUM, comm);
    innet_mpi_decide(r->st->session, kind, r->bytes, medians[0], medians[1]);
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

/* Where every rank of `comm` is anyway (after a blocking MPI_Allreduce or MPI_Barrier the
 * application called): the ranks agree on a non-blocking size class whose trial calls are
 * all started, if any (innet-mpi/src/learn/started.rs). Waiting here cannot deadlock a
 * program that the collective itself does not. */
static void nb_agree(struct comm_state *st, MPI_Comm comm) {
    int kind;
    size_t bytes;
    double part[4];
    if (!st || !st->session || !innet_mpi_nb_due(st->session, &kind, &bytes, part)) return;
    PMPI_Allreduce(MPI_IN_PLACE, part, 4, MPI_DOUBLE, MPI_SUM, comm);
    innet_mpi_nb_decide(st->session, kind, bytes, part);
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
    learn_done(&r, comm, INNET_KIND_ALLREDUCE);
    nb_agree(r.st, comm);
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
    learn_done(&r, comm, INNET_KIND_REDUCE);
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
    learn_done(&r, comm, INNET_KIND_BCAST);
    return rc;
}

EXPORT int MPI_Barrier(MPI_Comm comm) {
    if (!barrier_on) {
        innet_mpi_passed(INNET_KIND_BARRIER, INNET_PASS_DISABLED);
        int rc = PMPI_Barrier(comm);
        /* Still a point every rank reaches: the non-blocking kinds agree here too. */
        nb_agree(joined(comm), comm);
        return rc;
    }
    struct comm_state *st = served(comm, INNET_KIND_BARRIER);
    if (!st) return PMPI_Barrier(comm);
    int zero = 0, rc;
    struct shape s = {INNET_I32, sizeof(int), 0};
    /* A barrier's trial sample runs from its entry to the next barrier's (Learner::spanning
     * in innet-mpi/src/learn.rs): what its release costs the calls after it is its too. */
    if (st->barrier_span) {
        struct route span = {st, INNET_ROUTE_TRIAL, sizeof zero, st->barrier_t0};
        learn_done(&span, comm, INNET_KIND_BARRIER);
    }
    struct route r;
    route_for(&r, st, INNET_KIND_BARRIER, sizeof zero);
    st->barrier_span = r.bits & INNET_ROUTE_TRIAL;
    st->barrier_t0 = r.t0;
    if (!through_network(&r))
        rc = PMPI_Barrier(comm);
    else
        rc = through_innet(st, comm, INNET_KIND_BARRIER, NULL, &zero, 1, &s, INNET_OP_SUM);
    nb_agree(st, comm);
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
 * its own block at its offset (innet_mpi_allgather lays them out). */
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
        rc = innet_outcome(
            innet_mpi_allgather(st->session, in_place ? NULL : sendbuf, recvbuf, block), st, comm);
    learn_done(&r, comm, INNET_KIND_ALLGATHER);
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
    return innet_outcome(
        innet_mpi_reduce_scatter(r->st->session, kind, sendbuf == MPI_IN_PLACE ? NULL : sendbuf,
                                 recvbuf, counts, (size_t)block, s.stride, s.loc_offset, code,
                                 s.dtype),
        r->st, comm);
}

EXPORT int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
                                    MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
    int size, kind = INNET_KIND_REDUCE_SCATTER_BLOCK;
    PMPI_Comm_size(comm, &size);
    struct route r;
    int rc = reduce_scatter(&r, comm, kind, sendbuf, recvbuf, NULL, recvcount,
                            (long long)recvcount * size, datatype, op);
    if (rc < 0) rc = PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
    learn_done(&r, comm, kind);
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
    learn_done(&r, comm, kind);
    return rc;
}

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
 * below; Session::route_nonblocking). */
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

/* A non-blocking call's way. */
struct nb_route {
    struct comm_state *st; /* NULL: the communicator is not innet's */
    int kind, bits;        /* INNET_KIND_*, INNET_ROUTE_* */
    uint32_t ticket;
    size_t bytes;
    struct timespec t0;
};

/* After the start: a timed trial call's request is watched until the application sees it
 * complete. */
static void nb_watch(const struct nb_route *r, MPI_Request request) {
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
        if (t.st->session) innet_mpi_nb_took(t.st->session, t.kind, t.bytes, t.ticket, ns);
        return;
    }
}

/* A communicator goes: its watched calls with it. */
static void trials_forget(const struct comm_state *st) {
    for (int i = 0; i < trial_count;)
        if (trials[i].st == st) trials[i] = trials[--trial_count];
        else i++;
    trial_oldest = 0;
}

/* The handles a Wait or Test form was given, kept before MPI frees them, when a trial
 * call may be among them. */
struct seen {
    MPI_Request *before, local[16];
    int n;
};

static void seen_begin(struct seen *v, int n, const MPI_Request *reqs) {
    v->before = NULL;
    v->n = 0;
    if (trial_count == 0 || n <= 0) return;
    v->before = n <= 16 ? v->local : malloc((size_t)n * sizeof *reqs);
    if (!v->before) return; /* no memory: these samples are lost, nothing else */
    memcpy(v->before, reqs, (size_t)n * sizeof *reqs);
    v->n = n;
}

/* Request `i` (or every one, -1) was found complete. */
static void seen_done(struct seen *v, int i) {
    if (!v->before) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (int k = i < 0 ? 0 : i; k < (i < 0 ? v->n : i + 1) && k < v->n; k++)
        if (v->before[k] != MPI_REQUEST_NULL) trial_seen(v->before[k], &now);
}

static void seen_end(struct seen *v) {
    if (v->before && v->before != v->local) free(v->before);
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
    r->bits = innet_mpi_nb_route(st->session, kind, bytes,
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
    if (innet_mpi_iallreduce(st->session, kind, send, recv, count, s->stride, s->loc_offset,
                             op, s->dtype, nb_done, c) != 0)
        nb_done(c, 1);
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
