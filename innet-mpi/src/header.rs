//! The C header of [`crate::abi`], generated from the Rust definitions (the codes of
//! innet_common's `Op` and `Dtype`, [`Kind`], [`Pass`], the route bits, the layouts of
//! [`Oob`] and [`Call`]) so that the shim and this library cannot drift apart.
//! `cargo xtask build` writes it next to the shim's objects (the `innet-mpi-header`
//! binary), and the shim includes it.

use std::{fmt::Write as _, mem::offset_of};

use innet_common::proto::{Dtype, Op};

use crate::{
    abi::{Call, ROUTE_NETWORK, ROUTE_TRIAL},
    kind::{Kind, Pass},
    oob::Oob,
};

/// A C struct member: its declaration (`type name`), the size and alignment of its type,
/// and the offset Rust gives it.
struct Field {
    name: &'static str,
    decl: &'static str,
    size: usize,
    offset: usize,
}

const PTR: usize = size_of::<*const u8>();
const INT: usize = size_of::<std::ffi::c_int>();
const SIZE_T: usize = size_of::<usize>();

fn oob_fields() -> [Field; 4] {
    [
        Field {
            name: "ctx",
            decl: "void *ctx",
            size: PTR,
            offset: offset_of!(Oob, ctx),
        },
        Field {
            name: "rank",
            decl: "int rank",
            size: INT,
            offset: offset_of!(Oob, rank),
        },
        Field {
            name: "size",
            decl: "int size",
            size: INT,
            offset: offset_of!(Oob, size),
        },
        Field {
            name: "allgather",
            decl: "int (*allgather)(void *ctx, const void *send, void *recv, size_t bytes)",
            size: PTR,
            offset: offset_of!(Oob, allgather),
        },
    ]
}

fn call_fields() -> [Field; 10] {
    [
        Field {
            name: "kind",
            decl: "int kind",
            size: INT,
            offset: offset_of!(Call, kind),
        },
        Field {
            name: "op",
            decl: "int op",
            size: INT,
            offset: offset_of!(Call, op),
        },
        Field {
            name: "dtype",
            decl: "int dtype",
            size: INT,
            offset: offset_of!(Call, dtype),
        },
        Field {
            name: "send",
            decl: "const void *send",
            size: PTR,
            offset: offset_of!(Call, send),
        },
        Field {
            name: "recv",
            decl: "void *recv",
            size: PTR,
            offset: offset_of!(Call, recv),
        },
        Field {
            name: "count",
            decl: "size_t count",
            size: SIZE_T,
            offset: offset_of!(Call, count),
        },
        Field {
            name: "stride",
            decl: "size_t stride",
            size: SIZE_T,
            offset: offset_of!(Call, stride),
        },
        Field {
            name: "loc_offset",
            decl: "size_t loc_offset",
            size: SIZE_T,
            offset: offset_of!(Call, loc_offset),
        },
        Field {
            name: "counts",
            decl: "const int *counts",
            size: PTR,
            offset: offset_of!(Call, counts),
        },
        Field {
            name: "block",
            decl: "size_t block",
            size: SIZE_T,
            offset: offset_of!(Call, block),
        },
    ]
}

/// The functions of [`crate::abi`], as C declares them.
const PROTOTYPES: &str = "\
/* 1 when innet serves the job, 0 when every collective goes to MPI (after MPI_Init;
 * collective over `world` when innet finds the placement). */
int innet_mpi_start(const struct innet_mpi_oob *world, const char *processor, int len);
/* Joins innet for a communicator (collective over it): a session, or NULL when innet does
 * not serve it. `comm->ctx` stays valid until innet_mpi_close. */
void *innet_mpi_open(const struct innet_mpi_oob *comm, const int *world_ranks);
void innet_mpi_close(void *session);
/* INNET_ROUTE_* bits of the next call (`ticket`: a non-blocking call's, NULL for none). */
int innet_mpi_route(void *session, int kind, size_t bytes, uint32_t *ticket);
/* A timed trial call's time (collective after a blocking call). */
void innet_mpi_took(void *session, int kind, size_t bytes, uint32_t ticket, uint64_t nanos);
/* Where every rank is (a blocking collective): the non-blocking cutover's agreements. */
void innet_mpi_agree(void *session);
/* 0: served; 1: failed (the communicator is then MPI's). */
int innet_mpi_collective(void *session, const struct innet_mpi_call *call);
/* 0: started, done(arg, failed) runs once when it is over; 1: not started. */
int innet_mpi_start_collective(void *session, const struct innet_mpi_call *call,
                               void (*done)(void *arg, int failed), void *arg);
/* The application's thread waits (1) or tests (0) for a started call. */
void innet_mpi_progress(void *session, int wait);
void innet_mpi_passed(int kind, int reason);
void innet_mpi_finish(void);
";

fn enumeration(out: &mut String, source: &str, codes: impl IntoIterator<Item = (String, usize)>) {
    let _ = writeln!(out, "/* {source} */\nenum {{");
    for (name, value) in codes {
        let _ = writeln!(out, "    {name} = {value},");
    }
    out.push_str("};\n\n");
}

/// A struct, and the checks that make the C compiler hold it to Rust's layout.
fn structure(out: &mut String, name: &str, doc: &str, fields: &[Field], size: usize) {
    let _ = writeln!(out, "/* {doc} */\nstruct {name} {{");
    for f in fields {
        let _ = writeln!(out, "    {};", f.decl);
    }
    out.push_str("};\n");
    for f in fields {
        let _ = writeln!(
            out,
            "_Static_assert(offsetof(struct {name}, {0}) == {1} && sizeof(((struct {name} *)0)->{0}) == {2}, \"{name}.{0} as Rust lays it out\");",
            f.name, f.offset, f.size
        );
    }
    let _ = writeln!(
        out,
        "_Static_assert(sizeof(struct {name}) == {size}, \"{name} as Rust lays it out\");\n"
    );
}

/// The header's text.
#[must_use]
pub fn c_header() -> String {
    let mut out = String::from(
        "/* innet_mpi.h: the C ABI of libinnet_mpi (innet-mpi/src/abi.rs), generated by\n \
         * innet-mpi/src/header.rs. Do not edit: `cargo xtask build` writes it again. */\n\
         #ifndef INNET_MPI_H\n#define INNET_MPI_H\n\n#include <stddef.h>\n#include <stdint.h>\n\n",
    );
    let upper = |s: &str| s.to_uppercase();
    enumeration(
        &mut out,
        "innet_common::proto::Op",
        Op::ALL.map(|o| (format!("INNET_OP_{}", upper(o.name())), o as usize)),
    );
    enumeration(
        &mut out,
        "innet_common::proto::Dtype",
        Dtype::ALL.map(|d| (format!("INNET_{}", upper(d.short())), d as usize)),
    );
    enumeration(
        &mut out,
        "innet_mpi::kind::Kind",
        Kind::ALL.map(|k| (format!("INNET_KIND_{}", upper(k.name())), k.index())),
    );
    enumeration(
        &mut out,
        "innet_mpi::kind::Pass",
        Pass::ALL.map(|p| (format!("INNET_PASS_{}", upper(p.name())), p as usize)),
    );
    enumeration(
        &mut out,
        "innet_mpi_route's bits",
        [
            ("INNET_ROUTE_NETWORK".to_owned(), ROUTE_NETWORK as usize),
            ("INNET_ROUTE_TRIAL".to_owned(), ROUTE_TRIAL as usize),
        ],
    );
    structure(
        &mut out,
        "innet_mpi_oob",
        "A communicator for Rust: its rank, size and an allgather of bytes over it (0: done)",
        &oob_fields(),
        size_of::<Oob>(),
    );
    structure(
        &mut out,
        "innet_mpi_call",
        "One collective call (innet_mpi::abi::Call)",
        &call_fields(),
        size_of::<Call>(),
    );
    out.push_str(PROTOTYPES);
    out.push_str("\n#endif\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C's offsets of `fields` on this target (each member at the next multiple of its
    /// size, all of them naturally aligned scalars or pointers) are Rust's.
    fn laid_out_as_c(fields: &[Field], rust_size: usize) {
        let mut at = 0usize;
        let mut align = 1;
        for f in fields {
            at = at.next_multiple_of(f.size);
            assert_eq!(f.offset, at, "{}", f.decl);
            at += f.size;
            align = align.max(f.size);
        }
        assert_eq!(at.next_multiple_of(align), rust_size);
    }

    #[test]
    fn the_structs_are_laid_out_as_c_lays_them_out() {
        laid_out_as_c(&oob_fields(), size_of::<Oob>());
        laid_out_as_c(&call_fields(), size_of::<Call>());
    }

    #[test]
    fn the_header_declares_every_exported_function_once() {
        let exported: Vec<&str> = include_str!("abi.rs")
            .lines()
            .filter_map(|l| {
                l.split_once("extern \"C\" fn ")?
                    .1
                    .split_once('(')
                    .map(|p| p.0)
            })
            .collect();
        assert_eq!(exported.len(), 11, "{exported:?}");
        let header = c_header();
        for f in &exported {
            assert_eq!(header.matches(&format!("{f}(")).count(), 1, "{f}");
        }
    }

    #[test]
    fn the_codes_are_the_rust_values() {
        let header = c_header();
        assert!(header.contains("INNET_KIND_REDUCE_SCATTER_BLOCK = 9,"));
        assert!(header.contains("INNET_PASS_LEARNING = 8,"));
        assert!(header.contains("INNET_OP_MAXLOC = 11,"));
        assert!(header.contains("INNET_F64 = 9,"));
        assert!(header.contains("INNET_ROUTE_TRIAL = 2,"));
    }
}
