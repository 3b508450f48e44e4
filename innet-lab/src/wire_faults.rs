//! The fault injector of test fabrics (`innet_fault`) from userspace: wires two ports of the
//! current network namespace together, sets what each direction does to INC data, re-sends
//! the frames it delays, and reads what it did. Everything is detached when dropped. Its
//! programs live in the lab's own eBPF object ([`innet_objects::lab_object`]), never in the
//! one operators load.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    io,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, Map, MapData, MapError, PerCpuHashMap, RingBuf},
    programs::{ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode},
};
use innet_common::{
    fault::{DelayedFrame, FaultConfig, FaultStats, PPM},
    maps::{FAULT_CONFIG, FAULT_DELAYED, FAULT_STATS, PROG_FAULT, PROG_PASS},
};
use innet_net::netdev::{self, PacketSocket};

/// What went wrong with the fault injector; each says what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("fault injector: {0}")]
    Bad(String),
    #[error(transparent)]
    Object(#[from] innet_objects::ObjectMissing),
    #[error("loading the lab's eBPF object")]
    Load(#[from] aya::EbpfError),
    #[error("no {0} in the lab's eBPF object")]
    Missing(&'static str),
    #[error("{what}")]
    Program {
        what: String,
        #[source]
        source: ProgramError,
    },
    #[error("map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error(transparent)]
    Netdev(#[from] netdev::NetdevError),
    #[error("the delay line's AF_PACKET socket")]
    Io(#[from] io::Error),
}

type Result<T> = std::result::Result<T, FaultError>;

/// What one direction of a wire does to the INC data packets of `kinds`
/// (`innet_common::fault::KIND_*`), as fractions of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    pub kinds: u32,
    pub drop: f64,
    pub duplicate: f64,
    pub delay: f64,
    /// How long a delayed packet is held (later packets overtake it: reordering).
    pub delay_for: Duration,
}

impl Faults {
    /// The kernel's config for a port whose frames leave through `peer_ifindex`.
    fn config(&self, peer_ifindex: u32) -> Result<FaultConfig> {
        let ppm = |what: &str, p: f64| {
            if (0.0..=1.0).contains(&p) {
                #[expect(
                    clippy::cast_sign_loss,
                    clippy::cast_possible_truncation,
                    reason = "p is in 0..=1, so the product is in 0..=PPM"
                )]
                Ok((p * f64::from(PPM)).round() as u32)
            } else {
                Err(FaultError::Bad(format!("{what} rate {p} is not in 0..=1")))
            }
        };
        let cfg = FaultConfig {
            peer_ifindex,
            kinds: self.kinds,
            drop_ppm: ppm("drop", self.drop)?,
            duplicate_ppm: ppm("duplicate", self.duplicate)?,
            delay_ppm: ppm("delay", self.delay)?,
            delay_us: u32::try_from(self.delay_for.as_micros())
                .map_err(|_| FaultError::Bad(format!("delay {:?} is too long", self.delay_for)))?,
        };
        if cfg.drop_ppm + cfg.duplicate_ppm + cfg.delay_ppm > PPM {
            return Err(FaultError::Bad(format!(
                "drop + duplicate + delay rates add up to more than 1: {self:?}"
            )));
        }
        Ok(cfg)
    }
}

/// `innet_fault` on the wire ports of the current network namespace.
pub struct FaultInjector {
    ebpf: Ebpf,
    config: Mutex<HashMap<MapData, u32, FaultConfig>>,
    stats: PerCpuHashMap<MapData, u32, FaultStats>,
    delay_line: DelayLine,
}

impl FaultInjector {
    /// Loads the lab's object and starts the delay line.
    ///
    /// # Errors
    /// Not root, or a load failure.
    pub fn load() -> Result<Self> {
        netdev::require_root("loading the fault injector")?;
        let mut ebpf = EbpfLoader::new().load(innet_objects::lab_object()?)?;
        program_mut::<SchedClassifier>(&mut ebpf, PROG_FAULT)?
            .load()
            .map_err(program_error(PROG_FAULT))?;
        program_mut::<Xdp>(&mut ebpf, PROG_PASS)?
            .load()
            .map_err(program_error(PROG_PASS))?;
        let config = take_map(&mut ebpf, FAULT_CONFIG)?;
        let stats = take_map(&mut ebpf, FAULT_STATS)?;
        let ring = take_map(&mut ebpf, FAULT_DELAYED)?;
        let delay_line = DelayLine::start(ring)?;
        Ok(Self {
            ebpf,
            config: Mutex::new(config),
            stats,
            delay_line,
        })
    }

    /// Makes ports `a` and `b` one wire: whatever enters one leaves through the other,
    /// untouched until [`set`](Self::set). Returns their ifindexes.
    ///
    /// # Errors
    /// No such interface, or an attach or map failure.
    pub fn wire(&mut self, a: &str, b: &str) -> Result<(u32, u32)> {
        let (ia, ib) = (netdev::ifindex(a)?, netdev::ifindex(b)?);
        let mut map = self.config.lock().unwrap_or_else(PoisonError::into_inner);
        for (port, peer) in [(ia, ib), (ib, ia)] {
            map.insert(port, FaultConfig::forward(peer), 0)
                .map_err(|source| FaultError::Map {
                    name: FAULT_CONFIG,
                    source,
                })?;
        }
        for port in [a, b] {
            program_mut::<SchedClassifier>(&mut self.ebpf, PROG_FAULT)?
                .attach(port, TcAttachType::Ingress)
                .map_err(attach_error(port, "tcx ingress"))?;
            // The empty XDP program too, so that a switch's `XDP_TX` replies into this
            // port are delivered at once: a veth wakes its peer for `XDP_TX` frames only
            // when the peer runs XDP itself (a real NIC needs no such help).
            program_mut::<Xdp>(&mut self.ebpf, PROG_PASS)?
                .attach(port, XdpMode::Driver)
                .map_err(attach_error(port, "native XDP"))?;
        }
        Ok((ia, ib))
    }

    /// Sets what happens to the frames entering wire port `ifindex`.
    ///
    /// # Errors
    /// Not a wire port, rates out of range, or a map failure.
    pub fn set(&self, ifindex: u32, faults: Faults) -> Result<()> {
        let mut map = self.config.lock().unwrap_or_else(PoisonError::into_inner);
        let old = map.get(&ifindex, 0).map_err(|_| {
            FaultError::Bad(format!(
                "port {ifindex} is not a wire port: wire() it first"
            ))
        })?;
        map.insert(ifindex, faults.config(old.peer_ifindex)?, 0)
            .map_err(|source| FaultError::Map {
                name: FAULT_CONFIG,
                source,
            })
    }

    /// What wire port `ifindex` saw and did, summed over CPUs (zero before its first frame).
    ///
    /// # Errors
    /// A map read failure.
    pub fn stats(&self, ifindex: u32) -> Result<FaultStats> {
        let mut sum = FaultStats::default();
        if let Ok(per_cpu) = self.stats.get(&ifindex, 0) {
            for s in per_cpu.iter() {
                sum.accumulate(s);
            }
        }
        Ok(sum)
    }

    /// Delayed frames sent on so far (by every wire port).
    #[must_use]
    pub fn delayed_sent(&self) -> u64 {
        self.delay_line.sent.load(Ordering::Relaxed)
    }
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(FaultError::Missing(name))?
        .try_into()
        .map_err(program_error(name))
}

fn take_map<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T> {
    let map = ebpf.take_map(name).ok_or(FaultError::Missing(name))?;
    T::try_from(map).map_err(|source| FaultError::Map { name, source })
}

fn program_error(name: &'static str) -> impl FnOnce(ProgramError) -> FaultError {
    move |source| FaultError::Program {
        what: format!("loading {name}"),
        source,
    }
}

fn attach_error(port: &str, how: &str) -> impl FnOnce(ProgramError) -> FaultError {
    let what = format!("attaching to {port} ({how})");
    move |source| FaultError::Program { what, source }
}

/// Userspace half of the delay: takes held frames off the ring and sends each out of its
/// port (raw `AF_PACKET`, which tc ingress never sees again) once it is due.
struct DelayLine {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// A frame waiting: (due ns, ifindex, bytes).
type Held = Reverse<(u64, u32, Vec<u8>)>;

impl DelayLine {
    /// The socket is made here, in the caller's network namespace, where the ports are.
    fn start(mut ring: RingBuf<MapData>) -> io::Result<Self> {
        let sock = PacketSocket::new()?;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2) = (stop.clone(), sent.clone());
        let thread = std::thread::Builder::new()
            .name("innet-delay-line".into())
            .spawn(move || {
                let mut held: BinaryHeap<Held> = BinaryHeap::new();
                while !stop2.load(Ordering::Relaxed) {
                    while let Some(item) = ring.next() {
                        if item.len() >= size_of::<DelayedFrame>() {
                            // SAFETY: the kernel wrote a whole DelayedFrame (length checked).
                            let f: DelayedFrame =
                                unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                            let len = (f.len as usize).min(f.frame.len());
                            held.push(Reverse((f.due_ns, f.ifindex, f.frame[..len].to_vec())));
                        }
                    }
                    let now = innet_common::clock::ktime_ns();
                    while held.peek().is_some_and(|Reverse((due, _, _))| *due <= now) {
                        let Some(Reverse((_, ifindex, frame))) = held.pop() else {
                            break;
                        };
                        if sock.send(ifindex, &frame).is_ok() {
                            sent2.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            })?;
        Ok(Self {
            stop,
            sent,
            thread: Some(thread),
        })
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
