//! How long each phase of a long command took, printed as it ends and summed at the end, so
//! a CI log shows where its minutes went.

use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Phases(Vec<(&'static str, Duration)>, Vec<(&'static str, Duration)>);

impl Phases {
    /// Runs `f` as phase `name` and records its time, whether it succeeds or not.
    pub fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let took = start.elapsed();
        println!("phase {name}: {:.0} s", took.as_secs_f64());
        self.0.push((name, took));
        out
    }

    /// Records `name`, which ran beside the other phases (not added to the total).
    pub fn beside(&mut self, name: &'static str, took: Duration) {
        println!(
            "phase {name}: {:.0} s (beside the tests)",
            took.as_secs_f64()
        );
        self.1.push((name, took));
    }

    /// One line per phase and the total.
    #[must_use]
    pub fn summary(&self) -> String {
        let total: Duration = self.0.iter().map(|(_, d)| *d).sum();
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(n, d)| format!("{n} {:.0} s", d.as_secs_f64()))
            .collect();
        let beside: Vec<String> = self
            .1
            .iter()
            .map(|(n, d)| format!("; beside the tests: {n} {:.0} s", d.as_secs_f64()))
            .collect();
        let beside = beside.concat();
        format!(
            "phases: {} (total {:.0} s){beside}",
            parts.join(", "),
            total.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_timed_in_order_and_summed() {
        let mut p = Phases::default();
        assert_eq!(p.time("a", || 1 + 1), 2);
        p.time("b", || std::thread::sleep(Duration::from_millis(20)));
        let s = p.summary();
        assert!(s.starts_with("phases: a 0 s, b 0 s (total 0 s)"), "{s}");
        assert!(p.0[1].1 >= Duration::from_millis(20));
        p.beside("c", Duration::from_secs(7));
        assert!(
            p.summary()
                .ends_with("(total 0 s); beside the tests: c 7 s"),
            "{}",
            p.summary()
        );
    }
}
