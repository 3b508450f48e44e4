//! The ranks of one node meet in shared memory for the intra-node reduce and broadcast: a
//! segment per node and communicator (a file in `/dev/shm`, mapped by every rank of the
//! node, threads or processes alike), one slot per rank.
//!
//! Slot 0 carries the leader's result, slot `k` the contribution of the node's `k`-th
//! other rank. A writer fills the slot's data and length, then publishes the collective's
//! sequence number (release); a reader waits until the slot shows the number it wants
//! (acquire): a bounded spin that yields the CPU, then `futex(2)` on the sequence word,
//! woken only when someone sleeps there. One slot per direction is enough: a rank writes
//! its next contribution only after it has read the result of the last one, and the leader
//! writes the next result only after every rank's next contribution, so no slot is
//! overwritten before it was read.
//!
//! Messages longer than a slot go through the node-local datagram channel instead
//! ([`LocalChannel`](super::local::LocalChannel)).

use std::{
    fs::OpenOptions,
    io,
    os::fd::AsRawFd as _,
    path::PathBuf,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// Bytes a slot carries: messages up to this size use the segment.
pub const SLOT_BYTES: usize = 64 * 1024;
/// Slot header: sequence number, sleepers, length (each a u32), padded to a cache line.
const HEADER: usize = 64;
const SLOT: usize = HEADER + SLOT_BYTES;

/// One rank's mapping of its node's segment.
pub struct NodeSegment {
    base: NonNull<u8>,
    len: usize,
    path: PathBuf,
    slots: usize,
    spin: Duration,
}

// SAFETY: the mapping is shared memory accessed only through atomics and through slots
// whose ownership the sequence protocol hands over.
unsafe impl Send for NodeSegment {}

fn path(job: u64, leader_rank: usize) -> PathBuf {
    PathBuf::from("/dev/shm").join(format!("innet-{job:016x}-{leader_rank}.seg"))
}

impl NodeSegment {
    /// Maps the segment of the node whose leader is `leader_rank` in job `job`, with a slot
    /// for each of its `ranks` ranks (created by whichever rank comes first). Waits spin for
    /// at most `spin` before sleeping.
    ///
    /// # Errors
    /// `/dev/shm` cannot hold it, or the mapping fails.
    pub fn open(job: u64, leader_rank: usize, ranks: usize, spin: Duration) -> io::Result<Self> {
        let path = path(job, leader_rank);
        let len = ranks.max(1) * SLOT;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        // Every rank asks for the same size; growing a fresh file zeroes it.
        if file.metadata()?.len() < len as u64 {
            file.set_len(len as u64)?;
        }
        // SAFETY: a shared read-write mapping of a file at least `len` bytes long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            base: NonNull::new(p.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
            path,
            slots: ranks.max(1),
            spin,
        })
    }

    /// Sets how long waits spin before sleeping (0 for a progress thread, which must not
    /// take the CPU from the application while it waits).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    fn slot(&self, i: usize) -> *mut u8 {
        assert!(i < self.slots, "slot {i} of {}", self.slots);
        // SAFETY: inside the mapping (checked above).
        unsafe { self.base.as_ptr().add(i * SLOT) }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "slots start at multiples of 64 bytes in a page-aligned mapping"
    )]
    fn word(&self, i: usize, index: usize) -> &AtomicU32 {
        // SAFETY: the header's u32 words, aligned (the mapping is page-aligned, SLOT is a
        // multiple of 64) and only ever accessed atomically.
        unsafe { &*self.slot(i).cast::<AtomicU32>().add(index) }
    }

    /// Writes message `seq` into slot `i` and wakes whoever sleeps on it.
    ///
    /// # Panics
    /// `data` is longer than [`SLOT_BYTES`].
    pub fn post(&self, i: usize, seq: u32, data: &[u8]) {
        self.post_parts(i, seq, &[data]);
    }

    /// [`post`](Self::post) of a message made of `parts` end to end, copied straight into
    /// the slot (a result's report and its data, with no copy joining them first).
    ///
    /// # Panics
    /// The parts are longer than [`SLOT_BYTES`] together.
    pub fn post_parts(&self, i: usize, seq: u32, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(len <= SLOT_BYTES, "{len} bytes in a slot");
        let s = self.slot(i);
        let mut at = HEADER;
        for part in parts {
            // SAFETY: this rank owns slot `i` until it publishes `seq` (see the module
            // doc); the parts fit it (checked above).
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), s.add(at), part.len()) };
            at += part.len();
        }
        self.word(i, 2)
            .store(u32::try_from(len).unwrap_or(0), Ordering::Relaxed);
        self.word(i, 0).store(seq, Ordering::Release);
        if self.word(i, 1).load(Ordering::SeqCst) > 0 {
            futex_wake(self.word(i, 0));
        }
    }

    /// Waits until slot `i` holds message `seq`, then copies it into `out` (resized);
    /// `Err(TimedOut)` at `deadline`.
    ///
    /// # Errors
    /// The message did not come in time.
    pub fn wait(&self, i: usize, seq: u32, deadline: Instant, out: &mut Vec<u8>) -> io::Result<()> {
        let n = self.wait_for(i, seq, deadline)?;
        out.resize(n, 0);
        // SAFETY: the writer published `seq` after writing `n` bytes, and does not write
        // the slot again before this rank's next step.
        unsafe { std::ptr::copy_nonoverlapping(self.slot(i).add(HEADER), out.as_mut_ptr(), n) };
        Ok(())
    }

    /// [`wait`](Self::wait), copying the message straight into `parts` end to end (a
    /// result's report and the caller's buffer): `Ok(true)` when it was exactly as long as
    /// they are together, `Ok(false)` (nothing copied) when it was not.
    ///
    /// # Errors
    /// The message did not come in time.
    pub fn wait_into(
        &self,
        i: usize,
        seq: u32,
        deadline: Instant,
        parts: &mut [&mut [u8]],
    ) -> io::Result<bool> {
        let n = self.wait_for(i, seq, deadline)?;
        if n != parts.iter().map(|p| p.len()).sum::<usize>() {
            return Ok(false);
        }
        let mut at = HEADER;
        for part in parts.iter_mut() {
            // SAFETY: as in `wait`; the parts hold exactly the `n` bytes published.
            unsafe {
                std::ptr::copy_nonoverlapping(self.slot(i).add(at), part.as_mut_ptr(), part.len());
            }
            at += part.len();
        }
        Ok(true)
    }

    /// Waits until slot `i` holds message `seq`: its length.
    fn wait_for(&self, i: usize, seq: u32, deadline: Instant) -> io::Result<usize> {
        let word = self.word(i, 0);
        let spin_until = Instant::now() + self.spin;
        loop {
            let now_seq = word.load(Ordering::Acquire);
            if now_seq == seq {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no message from the node's other ranks in time",
                ));
            }
            if now < spin_until {
                std::thread::yield_now();
                continue;
            }
            let sleepers = self.word(i, 1);
            sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-checked by the kernel: a post between the load and here returns at once.
            futex_wait(word, now_seq, deadline - now);
            sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        Ok((self.word(i, 2).load(Ordering::Relaxed) as usize).min(SLOT_BYTES))
    }
}

impl Drop for NodeSegment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        // The first rank to leave removes the name; the others keep their mappings.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().try_into().unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    // SAFETY: a shared (not private) futex word in a MAP_SHARED mapping, a relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &raw const ts,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as above; wakes every sleeper.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(tag: u64) -> u64 {
        u64::from(std::process::id()) << 16 | tag
    }

    #[test]
    fn contributions_and_results_cross_between_threads_in_order() {
        let job = job(0x7a);
        let ranks = 4;
        let rounds = 200u32;
        let soon = || Instant::now() + Duration::from_secs(5);
        let members: Vec<_> = (1..ranks)
            .map(|k| {
                std::thread::spawn(move || {
                    // No spinning: every wait sleeps on the futex.
                    let seg = NodeSegment::open(job, 0, ranks, Duration::ZERO).unwrap();
                    let mut got = vec![];
                    for seq in 1..=rounds {
                        let mine = vec![k as u8; (seq as usize * 7) % 3000 + 1];
                        seg.post(k, seq, &mine);
                        seg.wait(0, seq, soon(), &mut got).unwrap();
                        assert_eq!(got.len(), mine.len());
                        assert_eq!(got[0] as usize, (1..ranks).sum::<usize>());
                    }
                })
            })
            .collect();
        let seg = NodeSegment::open(job, 0, ranks, Duration::from_micros(20)).unwrap();
        let mut buf = vec![];
        for seq in 1..=rounds {
            let mut total = 0usize;
            let mut len = 0;
            for k in 1..ranks {
                seg.wait(k, seq, soon(), &mut buf).unwrap();
                assert!(
                    buf.iter().all(|&b| b as usize == k),
                    "slot {k} holds its own"
                );
                total += buf[0] as usize;
                len = buf.len();
            }
            seg.post(0, seq, &vec![total as u8; len]);
        }
        for m in members {
            m.join().unwrap();
        }
        drop(seg);
        assert!(
            !path(job, 0).exists(),
            "the name is gone once the ranks left"
        );
    }

    #[test]
    fn a_message_in_parts_lands_in_parts_or_not_at_all() {
        let seg = NodeSegment::open(job(0x7c), 0, 2, Duration::from_micros(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(1);
        seg.post_parts(0, 5, &[&[1, 2], &[3, 4, 5]]);
        let (mut head, mut body) = ([0u8; 2], [0u8; 3]);
        assert!(seg.wait_into(0, 5, deadline, &mut [&mut head, &mut body]).unwrap());
        assert_eq!((head, body), ([1, 2], [3, 4, 5]));
        // Another length: nothing copied.
        let mut short = [9u8; 4];
        assert!(!seg.wait_into(0, 5, deadline, &mut [&mut short]).unwrap());
        assert_eq!(short, [9; 4]);
        let mut whole = vec![];
        seg.wait(0, 5, deadline, &mut whole).unwrap();
        assert_eq!(whole, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_missing_message_times_out() {
        let seg = NodeSegment::open(job(0x7b), 0, 2, Duration::from_micros(10)).unwrap();
        let t = Instant::now();
        let e = seg
            .wait(1, 1, t + Duration::from_millis(30), &mut vec![])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
