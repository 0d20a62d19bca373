//! A model load's progress on stderr: a bar (`indicatif`) on a terminal, a plain line at
//! each quarter otherwise (a log file), and nothing for a load done within a second, so a
//! small model starts as quietly as before.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use strata_model::LoadProgress;

/// How long a load runs before it is reported.
const QUIET: Duration = Duration::from_secs(1);

/// A reporter for one load, on stderr.
pub(crate) fn on_stderr() -> LoadProgress {
    let start = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let shown = Mutex::new(Shown::default());
    LoadProgress(Arc::new(move |done, total| {
        let elapsed = start.elapsed();
        let Ok(mut shown) = shown.lock() else { return };
        if terminal {
            shown.bar(elapsed, done, total);
        } else if let Some(line) = shown.line(elapsed, done, total) {
            eprintln!("{line}");
        }
    }))
}

/// What a reporter has shown so far.
#[derive(Default)]
struct Shown {
    bar: Option<ProgressBar>,
    /// Quarters of the load reported as lines.
    quarters: usize,
}

impl Shown {
    fn bar(&mut self, elapsed: Duration, done: usize, total: usize) {
        if self.bar.is_none() && elapsed < QUIET {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let style =
                ProgressStyle::with_template("[strata] loading {bar:30} {pos}/{len} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(total as u64).with_style(style)
        });
        bar.set_position(done as u64);
        if done >= total {
            bar.finish();
        }
    }

    /// The line to print for step `done` of `total`, if any: none within the first second,
    /// then one as each quarter of the steps completes (the last at the end).
    fn line(&mut self, elapsed: Duration, done: usize, total: usize) -> Option<String> {
        if elapsed < QUIET || total == 0 {
            return None;
        }
        let quarters = done.min(total) * 4 / total;
        if quarters <= self.quarters {
            return None;
        }
        self.quarters = quarters;
        Some(format!(
            "[strata] loading weights: {done} of {total} steps ({}%), {:.1} s",
            done.min(total) * 100 / total,
            elapsed.as_secs_f64()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_start_after_a_second_and_come_each_quarter() {
        let mut s = Shown::default();
        let (early, late) = (Duration::from_millis(300), Duration::from_millis(1500));
        assert_eq!(s.line(early, 10, 37), None, "a quick load stays quiet");
        assert_eq!(s.line(late, 9, 37), None, "9 of 37 is not yet a quarter");
        let first = s.line(late, 10, 37).expect("a quarter done");
        assert!(first.contains("10 of 37 steps (27%)"), "{first}");
        assert_eq!(s.line(late, 13, 37), None, "no line within a quarter");
        assert!(s.line(late, 19, 37).is_some(), "half");
        let last = s.line(late, 37, 37).expect("the end");
        assert!(last.contains("37 of 37 steps (100%)"), "{last}");
        assert_eq!(s.line(late, 37, 37), None, "the end once");
    }
}
