//! The eBPF object: loaded with its maps sized, its programs and maps taken by name.

use super::Sizing;
use aya::maps::{Map, MapError, ProgramArray};
use aya::programs::{Program, ProgramError, SchedClassifier, Xdp};
use aya::{Ebpf, EbpfLoader, VerifierLogLevel};
use innet_common::control::PROG_LOST;
use innet_common::group::{JUMP_AGG, JUMP_EMIT, JUMP_LOST, MAX_INPUTS, jump_fold};
use innet_common::maps::{
    GROUP_STATS, GROUPS, JUMP, NIC_COMPLETIONS, PROG_AGG, PROG_EGRESS, PROG_EMIT, PROG_FANOUT,
    PROG_FOLD_PREFIX, PROG_NIC, PROG_NIC_POST, PROG_SWITCH, SLOTS, STASH,
};
use innet_common::proto::{Dtype, Op};
use tracing::info;

use crate::error::{Error, Result};

/// Loads the embedded object with every program verified and the tail-call table filled,
/// the group maps sized as `sizing` says. Nothing is pinned or attached.
///
/// # Errors
/// A bad sizing, an object that does not match this binary, or a program the kernel
/// refuses.
pub fn load_switch(sizing: Sizing) -> Result<Ebpf> {
    let Sizing { capacity, window } = sizing.checked()?;
    let mut ebpf = load_object_with(|l| {
        l.map_max_entries(GROUPS, capacity)
            .map_max_entries(SLOTS, capacity * window)
            .map_max_entries(NIC_COMPLETIONS, capacity * window)
            .map_max_entries(STASH, capacity * window * MAX_INPUTS)
            .map_max_entries(GROUP_STATS, capacity);
    })?;
    info!(capacity, window, "group maps sized: {}", sizing.memory());
    // Every XDP program of the object.
    let names: Vec<String> = ebpf
        .programs()
        .filter(|(_, p)| matches!(p, aya::programs::Program::Xdp(_)))
        .map(|(n, _)| n.to_owned())
        .collect();
    for name in &names {
        let program = static_name(name);
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or(Error::MissingInObject {
                kind: "program",
                name: program,
            })?
            .try_into()
            .map_err(|source| Error::Load {
                program: name.clone(),
                source,
            })?;
        prog.load().map_err(|source| Error::Load {
            program: name.clone(),
            source,
        })?;
    }
    let fanout: &mut SchedClassifier = program_mut(&mut ebpf, PROG_FANOUT)?;
    fanout.load().map_err(|source| Error::Load {
        program: PROG_FANOUT.to_owned(),
        source,
    })?;
    let mut entries = vec![
        (JUMP_EMIT, PROG_EMIT.to_owned()),
        (JUMP_LOST, PROG_LOST.to_owned()),
        (JUMP_AGG, PROG_AGG.to_owned()),
    ];
    for op in Op::ALL {
        for dtype in Dtype::ALL.into_iter().filter(|d| op.defined_on(*d)) {
            let name = format!("{PROG_FOLD_PREFIX}{}_{}", op.name(), dtype.short());
            entries.push((jump_fold(op as u8, dtype as u8), name));
        }
    }
    let mut fds = Vec::with_capacity(entries.len());
    for (index, name) in &entries {
        let program = static_name(name);
        let prog = ebpf.program(name).ok_or(Error::MissingInObject {
            kind: "program",
            name: program,
        })?;
        let fd = prog.fd().and_then(|fd| fd.try_clone().map_err(Into::into));
        fds.push((
            *index,
            fd.map_err(|source| Error::Load {
                program: name.clone(),
                source,
            })?,
        ));
    }
    let map = ebpf.map_mut(JUMP).ok_or(Error::MissingInObject {
        kind: "map",
        name: JUMP,
    })?;
    let mut jump =
        ProgramArray::try_from(map).map_err(|source| Error::Map { name: JUMP, source })?;
    for (index, fd) in &fds {
        jump.set(*index, fd, 0)
            .map_err(|source| Error::Map { name: JUMP, source })?;
    }
    Ok(ebpf)
}

/// Program names for error messages.
fn static_name(name: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        PROG_SWITCH,
        PROG_EMIT,
        PROG_EGRESS,
        PROG_NIC,
        PROG_NIC_POST,
        PROG_LOST,
        PROG_AGG,
    ];
    KNOWN
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or("a fold program")
}

/// Parses the embedded object (programs not yet loaded).
///
/// # Errors
/// [`Error::ObjectMissing`] or [`Error::Object`].
pub fn load_object() -> Result<Ebpf> {
    load_object_with(|_| {})
}

pub(crate) fn load_object_with(configure: impl FnOnce(&mut EbpfLoader<'_>)) -> Result<Ebpf> {
    let level = if tracing::enabled!(tracing::Level::DEBUG) {
        VerifierLogLevel::VERBOSE | VerifierLogLevel::STATS
    } else {
        VerifierLogLevel::default()
    };
    let mut loader = EbpfLoader::new();
    loader.verifier_log_level(level);
    configure(&mut loader);
    loader
        .load(innet_objects::ebpf_object()?)
        .map_err(Error::Object)
}

/// A map as its aya type (`HashMap`, `PerCpuArray`, `RingBuf` …).
pub(crate) fn typed<T: TryFrom<Map, Error = MapError>>(name: &'static str, map: Map) -> Result<T> {
    T::try_from(map).map_err(|source| Error::Map { name, source })
}

/// Takes map `name` out of a loaded object, as its aya type (the programs keep using it).
pub(crate) fn take_map<T: TryFrom<Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T> {
    let map = ebpf
        .take_map(name)
        .ok_or(Error::MissingInObject { kind: "map", name })?;
    typed(name, map)
}

/// Program `name` of a loaded object, as its aya type (`Xdp`, `SchedClassifier` …).
pub(crate) fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(Error::MissingInObject {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(|source| Error::Load {
            program: name.to_owned(),
            source,
        })
}
