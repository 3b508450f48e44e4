//! The one thing the shim gives Rust of MPI: an allgather over a communicator
//! (`PMPI_Allgather` of bytes), out of band of innet. Discovery at `MPI_Init` (as an
//! [`innet_client::Bootstrap`]), a communicator's join and the learned cutover's
//! agreements all run over it.

use std::{
    error::Error as StdError,
    ffi::{c_int, c_void},
};

use innet_client::Bootstrap;

/// The shim's allgather: every rank's `bytes` at `send`, in rank order, into `recv`
/// (`size × bytes`); 0 when MPI did it.
pub type Allgather = unsafe extern "C" fn(
    ctx: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    bytes: usize,
) -> c_int;

/// A communicator as the shim hands it over (`struct innet_mpi_oob`): this rank, the
/// size, and the allgather over it, whose `ctx` names the communicator to the shim.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Oob {
    pub ctx: *mut c_void,
    pub rank: c_int,
    pub size: c_int,
    pub allgather: Option<Allgather>,
}

/// The shim's allgather failed (MPI's error; the call is collective, so every rank sees
/// it fail alike or MPI aborts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the out-of-band MPI_Allgather failed ({0})")]
pub struct OobError(String);

impl Oob {
    /// Every rank's `mine` (the same length on every rank), in rank order, end to end.
    ///
    /// # Errors
    /// No allgather, or MPI's failed.
    pub fn gather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>, OobError> {
        let Some(allgather) = self.allgather else {
            return Err(OobError("the shim gave none".into()));
        };
        let mut all = vec![0u8; mine.len() * self.size()];
        // SAFETY: `mine` and `all` are valid for one and `size` blocks of `mine.len()`
        // bytes; the shim's callback reads and writes only those.
        let rc = unsafe {
            allgather(
                self.ctx,
                mine.as_ptr().cast(),
                all.as_mut_ptr().cast(),
                mine.len(),
            )
        };
        if rc == 0 {
            Ok(all)
        } else {
            Err(OobError(format!("code {rc}")))
        }
    }

    /// Every rank's `values`, summed element by element in rank order: the same sums, bit
    /// for bit, on every rank.
    ///
    /// # Errors
    /// As [`gather_fixed`](Self::gather_fixed).
    pub fn sum<const N: usize>(&self, values: [f64; N]) -> Result<[f64; N], OobError> {
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.gather_fixed(&mine)?;
        let mut sums = [0.0; N];
        for rank in all.chunks_exact(8 * N) {
            for (s, v) in sums.iter_mut().zip(rank.chunks_exact(8)) {
                *s += f64::from_le_bytes(v.try_into().unwrap_or_default());
            }
        }
        Ok(sums)
    }

    /// Rank 0's `value`, on every rank.
    ///
    /// # Errors
    /// As [`gather_fixed`](Self::gather_fixed).
    pub fn from_rank0(&self, value: u64) -> Result<u64, OobError> {
        let all = self.gather_fixed(&value.to_le_bytes())?;
        Ok(u64::from_le_bytes(all[..8].try_into().unwrap_or_default()))
    }

    /// Whether `ok` holds on every rank.
    ///
    /// # Errors
    /// As [`gather_fixed`](Self::gather_fixed).
    pub fn all(&self, ok: bool) -> Result<bool, OobError> {
        Ok(self.gather_fixed(&[u8::from(ok)])?.iter().all(|&b| b == 1))
    }
}

/// Discovery over MPI: buffers of any length (the lengths go first).
impl Bootstrap for Oob {
    fn rank(&self) -> usize {
        usize::try_from(self.rank).unwrap_or(0)
    }

    fn size(&self) -> usize {
        usize::try_from(self.size).unwrap_or(0)
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Box<dyn StdError + Send + Sync>> {
        let lengths = self.gather_fixed(&(mine.len() as u64).to_le_bytes())?;
        let lengths: Vec<usize> = lengths
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize)
            .collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let mut padded = mine.to_vec();
        padded.resize(longest, 0);
        let all = self.gather_fixed(&padded)?;
        Ok(lengths
            .iter()
            .zip(all.chunks_exact(longest.max(1)))
            .map(|(&n, b)| b[..n].to_vec())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier, Mutex};

    use super::*;

    /// An in-process "MPI" of `size` ranks as threads: the allgather meets at a barrier.
    struct World {
        size: usize,
        slots: Mutex<Vec<Vec<u8>>>,
        meet: Barrier,
    }

    struct Ctx {
        world: Arc<World>,
        rank: usize,
    }

    unsafe extern "C" fn gather(
        ctx: *mut c_void,
        send: *const c_void,
        recv: *mut c_void,
        bytes: usize,
    ) -> c_int {
        // SAFETY: the test's own context and buffers.
        let ctx = unsafe { &*ctx.cast::<Ctx>() };
        let size = ctx.world.size;
        // SAFETY: as above: `bytes` to read, `size × bytes` to write.
        let (send, recv) = unsafe {
            (
                std::slice::from_raw_parts(send.cast::<u8>(), bytes),
                std::slice::from_raw_parts_mut(recv.cast::<u8>(), bytes * size),
            )
        };
        ctx.world.slots.lock().unwrap()[ctx.rank] = send.to_vec();
        ctx.world.meet.wait();
        let all = ctx.world.slots.lock().unwrap().concat();
        recv.copy_from_slice(&all);
        ctx.world.meet.wait();
        0
    }

    fn on_ranks<T: Send + 'static>(
        size: usize,
        f: impl Fn(Oob) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let world = Arc::new(World {
            size,
            slots: Mutex::new(vec![vec![]; size]),
            meet: Barrier::new(size),
        });
        let f = Arc::new(f);
        let ranks: Vec<_> = (0..size)
            .map(|rank| {
                let (world, f) = (Arc::clone(&world), Arc::clone(&f));
                std::thread::spawn(move || {
                    let mut ctx = Ctx { world, rank };
                    let oob = Oob {
                        ctx: std::ptr::from_mut(&mut ctx).cast(),
                        rank: rank as c_int,
                        size: size as c_int,
                        allgather: Some(gather),
                    };
                    f(oob)
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn sums_agree_bit_for_bit_and_rank0_speaks() {
        let out = on_ranks(4, |oob| {
            let rank = Bootstrap::rank(&oob);
            (
                oob.sum([rank as f64 * 0.1, 1.0]).unwrap(),
                oob.from_rank0(100 + rank as u64).unwrap(),
                oob.all(oob.rank != 2).unwrap(),
                oob.all(true).unwrap(),
            )
        });
        for o in &out {
            assert_eq!(o.0.map(f64::to_bits), out[0].0.map(f64::to_bits));
            assert_eq!(o.0[1].to_bits(), 4.0f64.to_bits());
            assert_eq!((o.1, o.2, o.3), (100, false, true));
        }
    }

    #[test]
    fn the_bootstrap_gathers_buffers_of_any_length() {
        let out = on_ranks(3, |oob| {
            let rank = Bootstrap::rank(&oob);
            Bootstrap::allgather(&oob, &vec![rank as u8; rank]).unwrap()
        });
        for o in out {
            assert_eq!(o, [vec![], vec![1], vec![2, 2]]);
        }
    }

    #[test]
    fn no_allgather_is_an_error() {
        let oob = Oob {
            ctx: std::ptr::null_mut(),
            rank: 0,
            size: 1,
            allgather: None,
        };
        assert!(oob.gather_fixed(&[1]).is_err());
    }
}
