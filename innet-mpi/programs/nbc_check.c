/* Checks MPI's non-blocking collectives: MPI_Iallreduce (SUM, MAX in place, MINLOC pairs),
 * MPI_Ireduce, MPI_Ibcast and MPI_Ibarrier, several outstanding at once on two
 * communicators, a blocking MPI_Allreduce started among them, completed by every MPI
 * completion call (Wait, Waitall, Waitany, Waitsome, Test, Testall, Testany, Testsome,
 * Request_get_status) while the rank computes. Every result is checked exactly against the
 * local reduction of every rank's input; exits non-zero on the first wrong one (how much
 * of a call hides behind computation is nbc_overlap's to measure). With `--thread single|funneled|serialized|multiple` it starts with MPI_Init_thread at that
 * level and checks that MPI provides it and MPI_Query_thread says so (the interposer must
 * not change it); without, MPI_Init and MPI_THREAD_SINGLE. Runs the same with and without
 * the interposer. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, size, checks;

static void fail(const char *what, int round, int i, long got, long want) {
    fprintf(stderr, "nbc_check: rank %d: %s wrong in round %d at %d: %ld, not %ld\n", rank,
            what, round, i, got, want);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static void expect(const char *what, int round, int i, long got, long want) {
    if (got != want) fail(what, round, i, got, want);
}

/* Rank r's element i of round k: small integers, exact in any order. */
static int value(int r, int i, int k) { return (r * 7 + i * 13 + k * 5) % 29 - 14; }

static volatile double sink;

/* Busy computation for `us` µs of wall time, as OSU's dummy_compute. */
static void compute(double us) {
    double t0 = MPI_Wtime();
    while ((MPI_Wtime() - t0) * 1e6 < us)
        for (int i = 0; i < 64; i++) sink += i * 0.5;
}

struct pair { int v, loc; };

/* One round's buffers. */
struct round {
    int n;
    int *sum_in, *sum_out;   /* Iallreduce SUM */
    double *max;             /* Iallreduce MAX, in place */
    long *red_in, *red_out;  /* Ireduce SUM to root size-1 */
    int *bc;                 /* Ibcast from root 1 % size */
    struct pair *loc_in, *loc_out; /* Iallreduce MINLOC */
    int *dup_in, *dup_out;   /* Iallreduce BXOR on the duplicate */
    int blocking_out;        /* a blocking MPI_Allreduce started among them */
};

enum { REQS = 7 };

static void start(struct round *b, int k, MPI_Comm dup, MPI_Request *req) {
    int n = b->n;
    for (int i = 0; i < n; i++) {
        b->sum_in[i] = value(rank, i, k);
        b->max[i] = value(rank, i, k + 1) + 0.5;
        b->red_in[i] = value(rank, i, k + 2) * 1000003L;
        b->bc[i] = rank == 1 % size ? value(99, i, k) : -1;
        b->loc_in[i] = (struct pair){value(rank, i, k + 3), rank};
        b->dup_in[i] = value(rank, i, k + 4) & 0xffff;
    }
    MPI_Iallreduce(b->sum_in, b->sum_out, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req[0]);
    MPI_Iallreduce(b->dup_in, b->dup_out, n, MPI_INT, MPI_BXOR, dup, &req[1]);
    MPI_Iallreduce(MPI_IN_PLACE, b->max, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req[2]);
    MPI_Ireduce(b->red_in, b->red_out, n, MPI_LONG, MPI_SUM, size - 1, MPI_COMM_WORLD, &req[3]);
    MPI_Ibcast(b->bc, n, MPI_INT, 1 % size, MPI_COMM_WORLD, &req[4]);
    MPI_Iallreduce(b->loc_in, b->loc_out, n, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD, &req[5]);
    MPI_Ibarrier(dup, &req[6]);
    /* A blocking collective among the outstanding ones. */
    int one = k + 1;
    MPI_Allreduce(&one, &b->blocking_out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
}

static void verify(const struct round *b, int k) {
    for (int i = 0; i < b->n; i++) {
        long sum = 0, red = 0, x = 0;
        double max = -1e300;
        struct pair lo = {1 << 30, 0};
        for (int r = 0; r < size; r++) {
            sum += value(r, i, k);
            double m = value(r, i, k + 1) + 0.5;
            if (m > max) max = m;
            red += value(r, i, k + 2) * 1000003L;
            int v = value(r, i, k + 3);
            if (v < lo.v) lo = (struct pair){v, r};
            x ^= value(r, i, k + 4) & 0xffff;
        }
        expect("iallreduce sum", k, i, b->sum_out[i], sum);
        expect("iallreduce bxor (dup)", k, i, b->dup_out[i], x);
        expect("iallreduce max (in place)", k, i, (long)(2 * b->max[i]), (long)(2 * max));
        if (rank == size - 1) expect("ireduce", k, i, b->red_out[i], red);
        expect("ibcast", k, i, b->bc[i], value(99, i, k));
        expect("iallreduce minloc value", k, i, b->loc_out[i].v, lo.v);
        expect("iallreduce minloc rank", k, i, b->loc_out[i].loc, lo.loc);
        checks += 7;
    }
    expect("blocking allreduce", k, 0, b->blocking_out, (long)size * (k + 1));
    checks++;
}

static void check_status(MPI_Status *st, const char *how, int k) {
    int cancelled = 1;
    MPI_Test_cancelled(st, &cancelled);
    expect(how, k, -1, cancelled, 0);
}

/* Completes the round's requests the `how`-th way, computing while they run. */
static void complete(MPI_Request *req, int how, int k) {
    MPI_Status st[REQS];
    int flag = 0, idx, out, done = 0, indices[REQS];
    switch (how % 9) {
    case 0: /* Wait, oldest first */
        for (int i = 0; i < REQS; i++) {
            MPI_Wait(&req[i], &st[0]);
            check_status(&st[0], "wait", k);
        }
        break;
    case 1: /* Wait, newest first */
        for (int i = REQS - 1; i >= 0; i--) MPI_Wait(&req[i], MPI_STATUS_IGNORE);
        break;
    case 2:
        compute(50);
        MPI_Waitall(REQS, req, st);
        for (int i = 0; i < REQS; i++) check_status(&st[i], "waitall", k);
        break;
    case 3:
        for (int i = 0; i < REQS; i++) {
            MPI_Waitany(REQS, req, &idx, &st[0]);
            if (idx == MPI_UNDEFINED || req[idx] != MPI_REQUEST_NULL) fail("waitany", k, idx, 0, 0);
        }
        MPI_Waitany(REQS, req, &idx, &st[0]);
        expect("waitany with none active", k, 0, idx, MPI_UNDEFINED);
        break;
    case 4:
        while (done < REQS) {
            MPI_Waitsome(REQS, req, &out, indices, st);
            if (out < 1) fail("waitsome", k, out, out, 1);
            done += out;
        }
        break;
    case 5: /* Test each until done, computing in between */
        for (int i = 0; i < REQS; i++) {
            for (flag = 0; !flag;) {
                MPI_Test(&req[i], &flag, &st[0]);
                if (!flag) compute(20);
            }
            check_status(&st[0], "test", k);
        }
        break;
    case 6:
        for (flag = 0; !flag;) {
            MPI_Testall(REQS, req, &flag, st);
            if (!flag) compute(20);
        }
        break;
    case 7:
        while (done < REQS) {
            MPI_Testany(REQS, req, &idx, &flag, &st[0]);
            if (flag && idx != MPI_UNDEFINED) done++;
            else compute(20);
        }
        break;
    case 8: /* Request_get_status leaves the requests alive; then Testsome frees them */
        for (int i = 0; i < REQS; i++) {
            for (flag = 0; !flag;) {
                MPI_Request_get_status(req[i], &flag, &st[0]);
                if (!flag) compute(20);
            }
            if (req[i] == MPI_REQUEST_NULL) fail("request_get_status freed", k, i, 0, 0);
        }
        while (done < REQS) {
            MPI_Testsome(REQS, req, &out, indices, st);
            if (out != MPI_UNDEFINED) done += out;
        }
        break;
    }
    for (int i = 0; i < REQS; i++)
        if (req[i] != MPI_REQUEST_NULL) fail("a request left active", k, i, 0, 0);
}

static void *xmalloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) MPI_Abort(MPI_COMM_WORLD, 3);
    return p;
}

/* The thread level named `name`, or -1. */
static int thread_level(const char *name) {
    const char *names[] = {"single", "funneled", "serialized", "multiple"};
    const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                          MPI_THREAD_MULTIPLE};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) return levels[i];
    return -1;
}

/* Starts MPI at the level asked for (MPI_Init without one) and checks what MPI says. */
static void init(int *argc, char ***argv, int asked) {
    int provided = MPI_THREAD_SINGLE, query = -1;
    if (asked < 0) MPI_Init(argc, argv);
    else MPI_Init_thread(argc, argv, asked, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Query_thread(&query);
    if (asked >= 0 && provided != asked) fail("provided thread level", 0, 0, provided, asked);
    expect("MPI_Query_thread", 0, 0, query, asked < 0 ? MPI_THREAD_SINGLE : provided);
    if (rank == 0) printf("nbc_check: thread level %d provided, %d queried\n", provided, query);
}

int main(int argc, char **argv) {
    int asked = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--thread") && i + 1 < argc) {
            asked = thread_level(argv[i + 1]);
            if (asked < 0) {
                fprintf(stderr, "nbc_check: --thread single|funneled|serialized|multiple\n");
                return 2;
            }
        }
    }
    init(&argc, &argv, asked);
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    const int counts[] = {1, 4, 64, 300};
    int k = 0;
    for (int c = 0; c < 4; c++) {
        int n = counts[c];
        /* Two rounds outstanding at once: 14 requests, then completed one way each. */
        struct round b[2];
        MPI_Request req[2][REQS];
        for (int j = 0; j < 2; j++) {
            b[j] = (struct round){.n = n,
                                  .sum_in = xmalloc(n * sizeof(int)),
                                  .sum_out = xmalloc(n * sizeof(int)),
                                  .max = xmalloc(n * sizeof(double)),
                                  .red_in = xmalloc(n * sizeof(long)),
                                  .red_out = xmalloc(n * sizeof(long)),
                                  .bc = xmalloc(n * sizeof(int)),
                                  .loc_in = xmalloc(n * sizeof(struct pair)),
                                  .loc_out = xmalloc(n * sizeof(struct pair)),
                                  .dup_in = xmalloc(n * sizeof(int)),
                                  .dup_out = xmalloc(n * sizeof(int))};
        }
        for (int how = 0; how < 9; how++, k += 2) {
            start(&b[0], k, dup, req[0]);
            start(&b[1], k + 1, dup, req[1]);
            compute(100);
            complete(req[1], how, k + 1);
            complete(req[0], how + 4, k);
            verify(&b[0], k);
            verify(&b[1], k + 1);
        }
        for (int j = 0; j < 2; j++) {
            free(b[j].sum_in), free(b[j].sum_out), free(b[j].max), free(b[j].red_in);
            free(b[j].red_out), free(b[j].bc), free(b[j].loc_in), free(b[j].loc_out);
            free(b[j].dup_in), free(b[j].dup_out);
        }
    }
    MPI_Comm_free(&dup);
    int all = 0;
    MPI_Reduce(&checks, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("nbc_check: %d checks passed on %d ranks\n", all, size);
    MPI_Finalize();
    return 0;
}
