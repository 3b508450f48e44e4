/* Checks MPI collectives with results computed locally from every rank's (deterministic)
 * input: all predefined ops on the C types innet reduces, in place and not, MINLOC/MAXLOC
 * pairs with and without padding, Reduce, Bcast, Barrier, Allgather, Reduce_scatter(_block),
 * duplicated, split and freed
 * communicators, and what innet hands to MPI (a user-defined op, long double). Exits
 * non-zero on the first wrong result. Runs the same with and without the interposer. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, checks;

static const char *checking = "";

static void fail(const char *what, int count, int i) {
    fprintf(stderr, "mpi_check: rank %d: %s %s (count %d) wrong at element %d\n", rank, checking,
            what, count, i);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* Rank r's element i: small integers, exact in any order, nonzero for PROD. */
static long value(int r, int i, int prod) {
    if (prod) return (r + i) % 3 == 0 ? 2 : ((r + i) % 5 == 0 ? -1 : 1);
    return (r * 7 + i * 13) % 23 - 11;
}

#define REDUCE(ctype, a, b, opname)                                                            \
    (!strcmp(opname, "sum")    ? (ctype)((a) + (b))                                            \
     : !strcmp(opname, "prod") ? (ctype)((a) * (b))                                            \
     : !strcmp(opname, "min")  ? ((a) < (b) ? (a) : (b))                                       \
     : !strcmp(opname, "max")  ? ((a) > (b) ? (a) : (b))                                       \
     : !strcmp(opname, "land") ? (ctype)((a) && (b))                                           \
     : !strcmp(opname, "lor")  ? (ctype)((a) || (b))                                           \
     : !strcmp(opname, "lxor") ? (ctype)(!(a) != !(b))                                         \
                               : (ctype)0)
#define BITWISE(ctype, a, b, opname)                                                           \
    (!strcmp(opname, "band")   ? (ctype)((a) & (b))                                            \
     : !strcmp(opname, "bor")  ? (ctype)((a) | (b))                                            \
                               : (ctype)((a) ^ (b)))

/* An input element: signed values straddle zero; unsigned ones are kept small and
 * non-negative (`shift`), because MPICH 4.0.2 takes MPI_UNSIGNED_CHAR's MIN and MAX as signed
 * (MIN of 200 and 3 is 200 there) and the program must pass on plain MPI too. */
#define INPUT(ctype, r, i, prod, shift) ((ctype)((prod) ? value(r, i, 1) : value(r, i, 0) + (shift)))

/* One allreduce of `count` ctype under `op` on `comm` (ranks `members` of the world), in
 * place or not, checked against the local reduction. */
#define CHECK_TYPE(ctype, mpitype, is_float, shift)                                                 \
    static void check_##ctype(MPI_Comm comm, MPI_Op op, const char *opname, int count,       \
                              int in_place) {                                                  \
        int crank, csize;                                                                      \
        checking = #mpitype;                                                                   \
        MPI_Comm_rank(comm, &crank);                                                           \
        MPI_Comm_size(comm, &csize);                                                           \
        int prod = !strcmp(opname, "prod");                                                    \
        int bitwise = !strcmp(opname, "band") || !strcmp(opname, "bor") ||                    \
                      !strcmp(opname, "bxor");                                                 \
        ctype *in = malloc(sizeof(ctype) * count), *out = malloc(sizeof(ctype) * count);       \
        for (int i = 0; i < count; i++) in[i] = INPUT(ctype, crank, i, prod, shift);           \
        if (in_place) {                                                                        \
            memcpy(out, in, sizeof(ctype) * count);                                            \
            MPI_Allreduce(MPI_IN_PLACE, out, count, mpitype, op, comm);                        \
        } else {                                                                               \
            MPI_Allreduce(in, out, count, mpitype, op, comm);                                  \
        }                                                                                      \
        for (int i = 0; i < count; i++) {                                                      \
            ctype acc = INPUT(ctype, 0, i, prod, shift);                                       \
            for (int r = 1; r < csize; r++) {                                                  \
                ctype v = INPUT(ctype, r, i, prod, shift);                                     \
                acc = bitwise ? BITWISE_##is_float(ctype, acc, v, opname)                      \
                              : REDUCE(ctype, acc, v, opname);                                 \
            }                                                                                  \
            if (memcmp(&acc, &out[i], sizeof acc)) {                                           \
                fprintf(stderr, "mpi_check: got %g, want %g\n", (double)out[i], (double)acc);  \
                fail(opname, count, i);                                                        \
            }                                                                                  \
        }                                                                                      \
        checks++;                                                                              \
        free(in);                                                                              \
        free(out);                                                                             \
    }
#define BITWISE_0(ctype, a, b, opname) BITWISE(ctype, a, b, opname)
#define BITWISE_1(ctype, a, b, opname) ((ctype)0)

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
CHECK_TYPE(i8, MPI_SIGNED_CHAR, 0, 0)
CHECK_TYPE(u8, MPI_UNSIGNED_CHAR, 0, 11)
CHECK_TYPE(short, MPI_SHORT, 0, 0)
CHECK_TYPE(u16, MPI_UNSIGNED_SHORT, 0, 11)
CHECK_TYPE(int, MPI_INT, 0, 0)
CHECK_TYPE(u32, MPI_UNSIGNED, 0, 11)
CHECK_TYPE(long, MPI_LONG, 0, 0)
CHECK_TYPE(u64, MPI_UNSIGNED_LONG, 0, 11)
CHECK_TYPE(float, MPI_FLOAT, 1, 0)
CHECK_TYPE(double, MPI_DOUBLE, 1, 0)

static void every_op(MPI_Comm comm, int count, int in_place) {
    MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX, MPI_BAND,
                    MPI_BOR, MPI_BXOR, MPI_LAND, MPI_LOR, MPI_LXOR};
    const char *names[] = {"sum", "prod", "min", "max", "band",
                           "bor", "bxor", "land", "lor", "lxor"};
    for (int o = 0; o < 10; o++) {
        check_i8(comm, ops[o], names[o], count, in_place);
        check_u8(comm, ops[o], names[o], count, in_place);
        check_short(comm, ops[o], names[o], count, in_place);
        check_u16(comm, ops[o], names[o], count, in_place);
        check_int(comm, ops[o], names[o], count, in_place);
        check_u32(comm, ops[o], names[o], count, in_place);
        check_long(comm, ops[o], names[o], count, in_place);
        check_u64(comm, ops[o], names[o], count, in_place);
        if (o < 4) { /* MPI defines only these on floats */
            check_float(comm, ops[o], names[o], count, in_place);
            check_double(comm, ops[o], names[o], count, in_place);
        }
    }
}

/* MINLOC/MAXLOC on `{ctype v; int loc;}`: values collide across ranks, so ties take the
 * smaller location. */
#define CHECK_PAIR(ctype, mpitype)                                                             \
    static void pair_##ctype(MPI_Comm comm, int count) {                                       \
        struct p { ctype v; int loc; };                                                        \
        int crank, csize;                                                                      \
        MPI_Comm_rank(comm, &crank);                                                           \
        MPI_Comm_size(comm, &csize);                                                           \
        struct p *in = calloc(count, sizeof *in), *out = calloc(count, sizeof *out);           \
        for (int m = 0; m < 2; m++) {                                                          \
            for (int i = 0; i < count; i++)                                                    \
                in[i] = (struct p){(ctype)(value(crank, i, 0) % 4), crank * 10 + i % 3};       \
            MPI_Allreduce(in, out, count, mpitype, m ? MPI_MAXLOC : MPI_MINLOC, comm);         \
            for (int i = 0; i < count; i++) {                                                  \
                struct p best = {(ctype)(value(0, i, 0) % 4), i % 3};                          \
                for (int r = 1; r < csize; r++) {                                              \
                    struct p c = {(ctype)(value(r, i, 0) % 4), r * 10 + i % 3};                \
                    int better = m ? c.v > best.v : c.v < best.v;                              \
                    if (better || (c.v == best.v && c.loc < best.loc)) best = c;               \
                }                                                                              \
                if (best.v != out[i].v || best.loc != out[i].loc) fail(#mpitype, count, i);    \
            }                                                                                  \
            checks++;                                                                          \
        }                                                                                      \
        free(in);                                                                              \
        free(out);                                                                             \
    }
CHECK_PAIR(int, MPI_2INT)
CHECK_PAIR(float, MPI_FLOAT_INT)
CHECK_PAIR(double, MPI_DOUBLE_INT)
CHECK_PAIR(short, MPI_SHORT_INT)
CHECK_PAIR(long, MPI_LONG_INT)

static void reduce_bcast_barrier(MPI_Comm comm) {
    int crank, csize;
    MPI_Comm_rank(comm, &crank);
    MPI_Comm_size(comm, &csize);
    int root = csize - 1;
    double in[100], out[100];
    for (int i = 0; i < 100; i++) in[i] = (double)value(crank, i, 0), out[i] = -1.0;
    MPI_Reduce(in, out, 100, MPI_DOUBLE, MPI_SUM, root, comm);
    for (int i = 0; i < 100; i++) {
        double want = 0;
        for (int r = 0; r < csize; r++) want += (double)value(r, i, 0);
        if (crank == root ? out[i] != want : out[i] != -1.0) fail("Reduce", 100, i);
    }
    checks++;
    if (crank == root) {
        MPI_Reduce(MPI_IN_PLACE, in, 100, MPI_DOUBLE, MPI_MAX, root, comm);
        for (int i = 0; i < 100; i++) {
            double want = (double)value(0, i, 0);
            for (int r = 1; r < csize; r++)
                if ((double)value(r, i, 0) > want) want = (double)value(r, i, 0);
            if (in[i] != want) fail("Reduce in place", 100, i);
        }
    } else {
        MPI_Reduce(in, NULL, 100, MPI_DOUBLE, MPI_MAX, root, comm);
    }
    checks++;
    int words[3000];
    for (int i = 0; i < 3000; i++) words[i] = crank == 0 ? i * 31 - 7 : 0x5a5a5a5a;
    MPI_Bcast(words, 3000, MPI_INT, 0, comm);
    for (int i = 0; i < 3000; i++)
        if (words[i] != i * 31 - 7) fail("Bcast", 3000, i);
    checks++;
    MPI_Barrier(comm);
    checks++;
}

/* Allgather (int and double blocks, in place and not) and reduce-scatter (equal blocks,
 * uneven counts with a rank that gets none, padded MINLOC pairs, in place), checked
 * against the inputs; a strided type's allgather goes to MPI. */
static void gather_scatter(MPI_Comm comm) {
    int crank, csize;
    MPI_Comm_rank(comm, &crank);
    MPI_Comm_size(comm, &csize);
    checking = "allgather";
    int blocks[] = {1, 3, 700};
    for (int b = 0; b < 3; b++) {
        int n = blocks[b], *all = malloc(sizeof(int) * (size_t)(n * csize)), mine[700];
        for (int i = 0; i < n; i++) mine[i] = (int)value(crank, i, 0) - (i % 2 ? 0x40000000 : 0);
        if (b == 1) {
            for (int i = 0; i < n * csize; i++) all[i] = 0x5a5a5a5a;
            memcpy(all + crank * n, mine, sizeof(int) * (size_t)n);
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, n, MPI_INT, comm);
        } else {
            MPI_Allgather(mine, n, MPI_INT, all, n, MPI_INT, comm);
        }
        for (int r = 0; r < csize; r++)
            for (int i = 0; i < n; i++)
                if (all[r * n + i] != (int)value(r, i, 0) - (i % 2 ? 0x40000000 : 0))
                    fail("Allgather", n, r * n + i);
        free(all);
        checks++;
    }
    double d = -0.5 * crank, *ds = malloc(sizeof(double) * (size_t)csize);
    MPI_Allgather(&d, 1, MPI_DOUBLE, ds, 1, MPI_DOUBLE, comm);
    for (int r = 0; r < csize; r++)
        if (ds[r] != -0.5 * r) fail("Allgather double", 1, r);
    free(ds);
    MPI_Datatype strided; /* every other int: not packed, so MPI gathers it */
    MPI_Type_vector(2, 1, 2, MPI_INT, &strided);
    MPI_Type_commit(&strided);
    int two[3] = {crank, -1, -crank}, *got = malloc(sizeof(int) * 3 * (size_t)csize);
    MPI_Allgather(two, 1, strided, got, 1, strided, comm);
    for (int r = 0; r < csize; r++)
        if (got[3 * r] != r || got[3 * r + 2] != -r) fail("Allgather strided", 1, r);
    MPI_Type_free(&strided);
    free(got);
    checks += 2;

    checking = "reduce-scatter";
    int n = 5, *in = malloc(sizeof(int) * (size_t)(n * csize)), part[5];
    for (int i = 0; i < n * csize; i++) in[i] = (int)value(crank, i, 0);
    MPI_Reduce_scatter_block(in, part, n, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < n; i++) {
        int want = 0;
        for (int r = 0; r < csize; r++) want += (int)value(r, crank * n + i, 0);
        if (part[i] != want) fail("Reduce_scatter_block", n, i);
    }
    MPI_Reduce_scatter_block(MPI_IN_PLACE, in, n, MPI_INT, MPI_MAX, comm);
    for (int i = 0; i < n; i++) {
        int want = (int)value(0, crank * n + i, 0);
        for (int r = 1; r < csize; r++)
            if ((int)value(r, crank * n + i, 0) > want) want = (int)value(r, crank * n + i, 0);
        if (in[i] != want) fail("Reduce_scatter_block in place", n, i);
    }
    free(in);
    /* Rank r gets r + 1 elements but the last rank, which gets none. */
    int *counts = malloc(sizeof(int) * (size_t)csize), total = 0, before = 0;
    for (int r = 0; r < csize; r++) {
        counts[r] = r == csize - 1 ? 0 : r + 1;
        if (r < crank) before += counts[r];
        total += counts[r];
    }
    struct { double v; int loc; } *pairs = malloc(sizeof *pairs * (size_t)(total + 1)), mins[64];
    for (int i = 0; i < total; i++)
        pairs[i].v = (double)value(crank, i, 0), pairs[i].loc = crank;
    MPI_Reduce_scatter(pairs, mins, counts, MPI_DOUBLE_INT, MPI_MINLOC, comm);
    for (int i = 0; i < counts[crank]; i++) {
        double want = (double)value(0, before + i, 0);
        int loc = 0;
        for (int r = 1; r < csize; r++)
            if ((double)value(r, before + i, 0) < want) want = (double)value(r, before + i, 0), loc = r;
        if (mins[i].v != want || mins[i].loc != loc) fail("Reduce_scatter MINLOC", counts[crank], i);
    }
    free(pairs);
    free(counts);
    checks += 3;
}

/* x ∘ y = x: associative, not commutative, so the result is rank 0's input. */
static void first_of(void *in, void *inout, int *len, MPI_Datatype *t) {
    (void)t;
    memcpy(inout, in, sizeof(int) * (size_t)*len);
}

/* What goes to MPI: a user-defined (non-commutative) op, and a type innet does not reduce. */
static void handed_to_mpi(MPI_Comm comm) {
    MPI_Op op;
    MPI_Op_create(first_of, 0, &op);
    int in[3] = {rank + 1, rank * 2, 7}, out[3];
    MPI_Allreduce(in, out, 3, MPI_INT, op, comm);
    if (out[0] != 1 || out[1] != 0 || out[2] != 7) fail("non-commutative user op", 3, 0);
    MPI_Op_free(&op);
    long double x[2] = {rank, 0.5L}, y[2];
    MPI_Allreduce(x, y, 2, MPI_LONG_DOUBLE, MPI_SUM, comm);
    if (y[0] != size * (size - 1) / 2 || y[1] != 0.5L * size) fail("long double", 2, 0);
    checks += 2;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int counts[] = {1, 7, 1000, 5000};
    for (int c = 0; c < 4; c++) every_op(MPI_COMM_WORLD, counts[c], c % 2);
    for (int c = 0; c < 4; c++) {
        pair_int(MPI_COMM_WORLD, counts[c]);
        pair_float(MPI_COMM_WORLD, counts[c]);
        pair_double(MPI_COMM_WORLD, counts[c]);
        pair_short(MPI_COMM_WORLD, counts[c]);
        pair_long(MPI_COMM_WORLD, counts[c]);
    }
    reduce_bcast_barrier(MPI_COMM_WORLD);
    gather_scatter(MPI_COMM_WORLD);
    MPI_Comm dup, half;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    every_op(dup, 33, 0);
    reduce_bcast_barrier(dup);
    MPI_Comm_free(&dup);
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    every_op(half, 100, 1);
    reduce_bcast_barrier(half);
    gather_scatter(half);
    MPI_Comm_free(&half);
    handed_to_mpi(MPI_COMM_WORLD);
    int total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_check: %d checks passed on %d ranks\n", total, size);
    MPI_Finalize();
    return 0;
}
