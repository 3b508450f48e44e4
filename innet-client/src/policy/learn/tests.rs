use super::*;

const KINDS: [&str; 2] = ["allreduce", "bcast"];

/// Runs one whole trial of `kind` 0 / `bytes` on a lone rank `l`, each way's call
/// taking what `ns` says for it; the decision and the calls it took.
fn trial_with(l: &mut Learner, bytes: usize, mut ns: impl FnMut(Way) -> u64) -> (Decision, u32) {
    for call in 1..=TRIAL_CALLS {
        let r = l.route(0, bytes);
        assert!(r.trial, "call {call}");
        if l.took(0, bytes, ns(r.way)) {
            assert!(call.is_multiple_of(ROUND_CALLS), "a checkpoint at {call}");
            let means = l.medians_us(0, bytes);
            if let Some(d) = l.decide_on_means(0, bytes, means) {
                return (d, call);
            }
        }
    }
    panic!("the trial never ended");
}

fn trial(l: &mut Learner, bytes: usize, network_ns: u64, mpi_ns: u64) -> (Decision, u32) {
    trial_with(l, bytes, |w| {
        if w == Way::Network {
            network_ns
        } else {
            mpi_ns
        }
    })
}

#[test]
fn size_classes_are_powers_of_two() {
    assert_eq!(
        [0, 1, 2, 3, 4, 5, 8, 9, 1024, 1025].map(class_of),
        [0, 0, 1, 2, 2, 3, 3, 4, 10, 11]
    );
    assert_eq!(class_max_bytes(class_of(3000)), 4096);
}

#[test]
fn a_trial_runs_blocks_of_each_way_and_times_all_but_their_first_calls() {
    let ways: Vec<Way> = (0..TRIAL_CALLS).map(Class::trial_way).collect();
    let n = |k: usize| vec![Way::Network; k];
    let m = |k: usize| vec![Way::Mpi; k];
    let block = BLOCK_CALLS as usize;
    let want = [n(block), m(block), m(block), n(block), n(block), m(block)].concat();
    assert_eq!(ways, want);
    let timed = (0..TRIAL_CALLS).filter(|&s| Class::timed(s)).count() as u32;
    assert_eq!(timed, ROUNDS * 2 * (BLOCK_CALLS - BLOCK_WARM_UP));
}

#[test]
fn a_clear_difference_ends_the_trial_after_one_round_a_close_one_after_all() {
    let mut l = Learner::new(0, &KINDS);
    let (d, calls) = trial(&mut l, 256, 30_000, 90_000);
    assert_eq!(
        (d.way, calls, d.max_bytes, d.after_calls),
        (Way::Network, ROUND_CALLS, 256, 0)
    );
    assert_eq!(d.samples, BLOCK_CALLS - BLOCK_WARM_UP);
    assert!(d.network_us < d.mpi_us, "{d:?}");
    let (d, calls) = trial(&mut l, 4096, 100_000, 95_000);
    assert_eq!(
        (d.way, calls),
        (Way::Mpi, TRIAL_CALLS),
        "5 % apart: every round"
    );
    assert_eq!(d.samples, ROUNDS * (BLOCK_CALLS - BLOCK_WARM_UP));
}

#[test]
fn the_decision_holds_until_the_recheck_which_needs_a_margin_to_move_it() {
    let mut l = Learner::new(0, &KINDS);
    assert_eq!(trial(&mut l, 256, 30_000, 90_000).0.way, Way::Network);
    // Another size class and another collective learn on their own.
    assert!(l.route(0, 4096).trial);
    assert!(l.route(1, 256).trial);
    for _ in 0..RECHECK_FIRST {
        assert_eq!(
            l.route(0, 200),
            Route {
                way: Way::Network,
                trial: false
            }
        );
    }
    // The re-check: MPI is 5 % faster now, inside the margin: the class stays.
    let (d, _) = trial(&mut l, 256, 100_000, 95_000);
    assert_eq!(d.way, Way::Network, "{d:?}");
    for _ in 0..RECHECK_EVERY {
        assert_eq!(l.route(0, 256).way, Way::Network);
    }
    // MPI 3× faster: it moves, and the re-checks keep their interval.
    let (d, _) = trial(&mut l, 256, 90_000, 30_000);
    assert_eq!(d.way, Way::Mpi);
    for _ in 0..RECHECK_EVERY {
        assert_eq!(l.route(0, 256).way, Way::Mpi);
    }
    assert!(l.route(0, 256).trial, "re-checked again");
}

/// The cold first calls of each block are not what decides: here every way's first
/// call after the other's takes 10× as long, and the network is faster when warm.
#[test]
fn a_ways_cold_first_calls_do_not_count() {
    let mut l = Learner::new(0, &KINDS);
    let mut last = None;
    let (d, _) = trial_with(&mut l, 8, |w| {
        let cold = last != Some(w);
        last = Some(w);
        let warm = if w == Way::Network { 50_000 } else { 80_000 };
        if cold { warm * 10 } else { warm }
    });
    assert_eq!(d.way, Way::Network, "{d:?}");
}

#[test]
fn the_decided_way_is_read_without_counting_a_call() {
    let mut l = Learner::new(0, &KINDS);
    assert_eq!(l.decided(0, 64), None);
    for _ in 0..ROUND_CALLS - 1 {
        let r = l.route(0, 64);
        l.took(
            0,
            64,
            if r.way == Way::Network {
                90_000
            } else {
                30_000
            },
        );
    }
    assert_eq!(l.decided(0, 64), None, "in its trial");
    let r = l.route(0, 64);
    assert!(l.took(
        0,
        64,
        if r.way == Way::Network {
            90_000
        } else {
            30_000
        }
    ));
    let means = l.medians_us(0, 64);
    l.decide_on_means(0, 64, means)
        .expect("clear after a round");
    assert_eq!(l.decided(0, 64), Some(Way::Mpi));
    assert_eq!(l.decided(0, 256), None, "another class");
    assert_eq!(l.decided(1, 64), None, "another kind");
    // Reading it does not move the re-check: the next call is still routed as decided.
    for _ in 0..1000 {
        assert_eq!(l.decided(0, 64), Some(Way::Mpi));
    }
    assert_eq!(l.route(0, 64).way, Way::Mpi);
}

/// Ranks that time differently take the same way: the ranks' mean decides, on every
/// rank alike, even where one rank alone would choose the other.
#[test]
fn the_ranks_mean_decides_for_every_rank() {
    // Rank 0 waits for the data (MPI slower for it); MPI lets ranks 1–3 go early.
    let times = [
        (10_000, 20_000),
        (10_000, 2_000),
        (10_000, 2_000),
        (10_000, 2_000),
    ];
    let mut ranks: Vec<Learner> = (0..4).map(|_| Learner::new(3, &KINDS)).collect();
    let decisions = run_ranks(&mut ranks, 64, |rank, w, _| {
        let (n, m) = times[rank];
        if w == Way::Network { n } else { m }
    });
    assert!(decisions.iter().all(|d| d.way == Way::Mpi), "{decisions:?}");
    assert_eq!(ranks[0].proposal(0, 64), Way::Network, "rank 0 alone");
    for l in &mut ranks {
        assert!(!l.route(0, 64).trial);
    }
}

/// One trial on every rank of `ranks` in step, each rank's call timed by
/// `ns(rank, way, call)`, the means agreed at each round's end as the shim does (the
/// sum of the ranks' medians over the ranks); every rank's decision.
fn run_ranks(
    ranks: &mut [Learner],
    bytes: usize,
    mut ns: impl FnMut(usize, Way, u32) -> u64,
) -> Vec<Decision> {
    for call in 1..=TRIAL_CALLS {
        let mut due = vec![];
        for (rank, l) in ranks.iter_mut().enumerate() {
            let r = l.route(0, bytes);
            due.push(l.took(0, bytes, ns(rank, r.way, call)));
        }
        assert!(
            due.iter().all(|&d| d == due[0]),
            "every rank at the same step"
        );
        if !due[0] {
            continue;
        }
        let mut sums = [0.0; 2];
        for l in ranks.iter_mut() {
            let [a, b] = l.medians_us(0, bytes);
            (sums[0], sums[1]) = (sums[0] + a, sums[1] + b);
        }
        let means = sums.map(|s| s / ranks.len() as f64);
        let decided: Vec<Option<Decision>> = ranks
            .iter_mut()
            .map(|l| l.decide_on_means(0, bytes, means))
            .collect();
        assert!(
            decided.iter().all(|d| d.is_some() == decided[0].is_some()),
            "the ranks end the trial together"
        );
        if decided[0].is_some() {
            return decided.into_iter().flatten().collect();
        }
    }
    panic!("the trial never ended");
}

/// A small deterministic generator for the noise tests (xorshift64*).
struct Noise(u64);
impl Noise {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A call's time: `base` times a log-normal factor (σ = 0.5: a CV of about 53 %),
    /// and one call in 20 a stall of 5× (an application's skew, a descheduled rank).
    #[expect(
        clippy::cast_sign_loss,
        clippy::cast_possible_truncation,
        reason = "a positive time well inside u64"
    )]
    fn time(&mut self, base: f64) -> u64 {
        let (u1, u2) = (self.unit().max(1e-12), self.unit());
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let stall = if self.unit() < 0.05 { 5.0 } else { 1.0 };
        (base * (0.5 * normal).exp() * stall) as u64
    }
}

/// How often 4 ranks under `noise` choose MPI when the network is `apart` faster
/// (MPI's time is the network's × (1 + `apart`)), and how many calls the trials took.
fn choose_mpi(noise: &mut Noise, apart: f64, trials: usize) -> (usize, u64) {
    let (mut mpi, mut calls) = (0, 0);
    for _ in 0..trials {
        let mut ranks: Vec<Learner> = (0..4).map(|_| Learner::new(0, &KINDS)).collect();
        let d = run_ranks(&mut ranks, 8, |_, w, _| {
            noise.time(if w == Way::Network {
                100_000.0
            } else {
                100_000.0 * (1.0 + apart)
            })
        });
        assert!(d.iter().all(|x| x.way == d[0].way), "the ranks agree");
        mpi += usize::from(d[0].way == Way::Mpi);
        calls += ranks[0].classes[class_of(8)].calls;
    }
    (mpi, calls)
}

/// How often a re-check of a class decided for the network moves it to MPI, when MPI
/// takes `mpi_factor` times the network's time.
fn recheck_flips(noise: &mut Noise, mpi_factor: f64, trials: usize) -> usize {
    let mut flips = 0;
    for _ in 0..trials {
        let mut ranks: Vec<Learner> = (0..4).map(|_| Learner::new(0, &KINDS)).collect();
        for l in &mut ranks {
            l.decide(0, 8, Way::Network);
            for _ in 0..RECHECK_FIRST {
                l.route(0, 8);
            }
        }
        let d = run_ranks(&mut ranks, 8, |_, w, _| {
            noise.time(if w == Way::Network {
                100_000.0
            } else {
                100_000.0 * mpi_factor
            })
        });
        flips += usize::from(d[0].way != Way::Network);
    }
    flips
}

/// The rule's error rates, stated in docs/mpi.md: 4 ranks, each call's time noisy on
/// its own rank (log-normal, CV ≈ 53 %, 5 % stalls of 5×), 2,000 first decisions per
/// case. The ways 50 % apart: the slower is chosen in under 0.5 % and the trial ends
/// after a round or two; 25 % apart: under 4 %. A decided class whose other way is 5 %
/// faster flips on a re-check in about a third of the re-checks (harmless: 5 %); one
/// whose other way is 25 % slower in under 1 %. The ranks always agree. Measured with
/// this seed: 1, 49, 12 and 687 of 2,000.
#[test]
fn decisions_under_noise_are_stable() {
    let mut noise = Noise(0x5eed_1234_abcd_0001);
    let trials = 2000;
    let (wrong_50, calls_50) = choose_mpi(&mut noise, 0.5, trials);
    let (wrong_25, calls_25) = choose_mpi(&mut noise, 0.25, trials);
    let flips_25 = recheck_flips(&mut noise, 1.25, trials);
    let close_flips = recheck_flips(&mut noise, 0.95, trials);
    eprintln!(
        "50 % apart: {wrong_50} of {trials} wrong, {:.1} calls a trial; 25 %: {wrong_25}, \
         {:.1} calls; re-checks flipped, MPI 25 % slower: {flips_25}, 5 % faster: {close_flips}",
        calls_50 as f64 / trials as f64,
        calls_25 as f64 / trials as f64
    );
    assert!(
        wrong_50 * 200 < trials,
        "50 % apart: {wrong_50} of {trials} wrong"
    );
    assert!(
        wrong_25 * 25 < trials,
        "25 % apart: {wrong_25} of {trials} wrong"
    );
    assert!(
        flips_25 * 100 < trials,
        "{flips_25} of {trials} right decisions flipped"
    );
}

#[test]
fn an_untimed_call_outside_a_trial_changes_nothing() {
    let mut l = Learner::new(0, &KINDS);
    assert!(!l.took(0, 8, 1));
    assert!(l.route(0, 8).trial);
}

#[test]
fn a_spanning_kind_keeps_only_spans_without_another_kinds_trial() {
    // Kind 1 spans; kind 0 is in trial for its first TRIAL_CALLS calls or fewer.
    let mut l = Learner::new(0, &KINDS).spanning(1);
    let first = l.route(1, 4);
    assert!(first.trial);
    // A span with a trial call of kind 0 in it: dropped, the same step again.
    assert!(l.route(0, 64).trial);
    assert!(!l.took(1, 4, 1_000));
    assert_eq!(l.route(1, 4), first);
    // Spans without one are kept: kind 1's trial runs on them alone and decides.
    let decided = loop {
        if l.took(1, 4, 1_000) {
            let means = l.medians_us(1, 4);
            if let Some(d) = l.decide_on_means(1, 4, means) {
                break d;
            }
        }
        assert!(l.route(1, 4).trial);
    };
    assert_eq!(decided.samples, ROUNDS * (BLOCK_CALLS - BLOCK_WARM_UP));
    // Kind 0's own trial is untouched by the spanning rule.
    assert!(!l.took(0, 64, 5));
    assert!(l.route(0, 64).trial);
}

/// Runs the spanning kind 1 after a decided call of kind 0 with `bytes` until its trial
/// decides, its spans taking `span_ns(way)`.
fn decide_span_after(l: &mut Learner, bytes: usize, span_ns: impl Fn(Way) -> u64) -> Decision {
    loop {
        let call = l.route(0, bytes);
        assert!(!call.trial, "kind 0 of {bytes} B is decided first");
        let barrier = l.route(1, 4);
        if barrier.trial && l.took(1, 4, span_ns(barrier.way)) {
            let means = l.medians_us(1, 4);
            if let Some(d) = l.decide_on_means(1, 4, means) {
                return d;
            }
        }
    }
}

#[test]
fn a_spanning_kind_is_classed_by_the_call_before_it() {
    let mut l = Learner::new(0, &KINDS).spanning(1);
    let small = l.seed((0..CLASSES).map(|c| (c == class_of(8)).then_some(Way::Network)));
    assert_eq!(small, 1);
    l.seed((0..CLASSES).map(|c| (c == class_of(65_536)).then_some(Way::Mpi)));
    // Around small calls the network's barrier wins the span; around large ones MPI's.
    let fast_network = |w| if w == Way::Network { 1_000 } else { 3_000 };
    let fast_mpi = |w| if w == Way::Network { 3_000 } else { 1_000 };
    let after_small = decide_span_after(&mut l, 8, fast_network);
    let after_large = decide_span_after(&mut l, 65_536, fast_mpi);
    assert_eq!((after_small.way, after_small.max_bytes), (Way::Network, 8));
    assert_eq!((after_large.way, after_large.max_bytes), (Way::Mpi, 65_536));
    // Each context keeps its own decision.
    assert!(!l.route(0, 8).trial);
    assert_eq!(
        l.route(1, 4),
        Route {
            way: Way::Network,
            trial: false
        }
    );
    assert_eq!(l.decided(1, 4), Some(Way::Network));
    assert!(!l.route(0, 65_536).trial);
    assert_eq!(l.decided(1, 4), Some(Way::Mpi));
    assert_eq!(
        l.route(1, 4),
        Route {
            way: Way::Mpi,
            trial: false
        }
    );
}
