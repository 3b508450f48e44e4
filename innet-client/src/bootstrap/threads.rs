//! A [`Bootstrap`] for ranks that are threads of one process: tests, and programs that
//! run a rank per thread.

use std::{
    error::Error as StdError,
    sync::{Arc, Condvar, Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::Bootstrap;

/// How long an allgather waits for the other threads before it gives up.
const PATIENCE: Duration = Duration::from_mins(1);

/// One rank's handle on an in-process group ([`Threads::group`]); move each into its
/// rank's thread.
#[derive(Clone, Debug)]
pub struct Threads {
    rank: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    size: usize,
    round: Mutex<Round>,
    changed: Condvar,
}

/// The allgather under way: filled slot by slot, then read by every rank before the next
/// one starts.
#[derive(Debug, Default)]
struct Round {
    number: u64,
    slots: Vec<Option<Vec<u8>>>,
    /// All slots filled: every rank's copy, and how many ranks have still to take it.
    done: Option<(Arc<Vec<Vec<u8>>>, usize)>,
}

impl Threads {
    /// Handles for ranks `0..size`, in rank order.
    #[must_use]
    pub fn group(size: usize) -> Vec<Self> {
        let shared = Arc::new(Shared {
            size,
            round: Mutex::new(Round {
                slots: vec![None; size],
                ..Round::default()
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| Self {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }
}

impl Bootstrap for Threads {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Box<dyn StdError + Send + Sync>> {
        let s = &*self.shared;
        let deadline = Instant::now() + PATIENCE;
        let wait = |r| {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("the other threads did not call allgather in time".into());
            }
            let (r, _) = s
                .changed
                .wait_timeout(r, left)
                .unwrap_or_else(PoisonError::into_inner);
            Ok::<_, Box<dyn StdError + Send + Sync>>(r)
        };
        let mut r = s.round.lock().unwrap_or_else(PoisonError::into_inner);
        // The last round's stragglers read first.
        while r.done.is_some() {
            r = wait(r)?;
        }
        let number = r.number;
        r.slots[self.rank] = Some(mine.to_vec());
        if r.slots.iter().all(Option::is_some) {
            let all = r.slots.iter_mut().map(|x| x.take().unwrap_or_default());
            r.done = Some((Arc::new(all.collect()), s.size));
            s.changed.notify_all();
        }
        while r.number == number && r.done.is_none() {
            r = wait(r)?;
        }
        let (all, left) = r.done.as_mut().expect("this round's results");
        let out = all.to_vec();
        *left -= 1;
        if *left == 0 {
            r.done = None;
            r.number += 1;
            s.changed.notify_all();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_gets_every_buffer_round_after_round() {
        let group = Threads::group(4);
        let handles: Vec<_> = group
            .into_iter()
            .map(|t| {
                std::thread::spawn(move || {
                    (0..50u8)
                        .map(|round| t.allgather(&[t.rank() as u8, round]).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for (round, all) in h.join().unwrap().into_iter().enumerate() {
                let want: Vec<Vec<u8>> = (0..4).map(|r| vec![r, round as u8]).collect();
                assert_eq!(all, want);
            }
        }
    }
}
