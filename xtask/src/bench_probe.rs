//! Whether a benchmark run had the CPU to itself: what else ran on the machine while it ran.
//!
//! On a shared machine (a VM with two vCPUs) another process, or the host stealing time,
//! slows one engine's run and not the other's, and the ratio of that round says nothing.
//! A [`Probe`] started before a child process and finished after it was waited for reads
//! the machine's busy and stolen CPU time (`/proc/stat`) and the CPU time of the waited-for
//! children (`getrusage(RUSAGE_CHILDREN)`); what the machine spent beyond the run's own time
//! is someone else's. Linux only; elsewhere the fields stay empty.

use std::time::Instant;

use serde_json::{json, Value};

/// CPU seconds (busy outside the run, stolen by the host) as read at one moment.
#[derive(Clone, Copy, Default)]
struct Counters {
    /// Busy time of every CPU (user, nice, system, irq, softirq), seconds.
    busy: f64,
    /// Time the hypervisor gave to others while a vCPU wanted to run, seconds.
    steal: f64,
    /// User + system time of this process's waited-for descendants, seconds.
    children: f64,
}

fn counters() -> Option<Counters> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    if cpu.len() < 8 {
        return None;
    }
    // SAFETY: sysconf and getrusage only write the struct we pass.
    let (hz, ru) = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) != 0 {
            return None;
        }
        (libc::sysconf(libc::_SC_CLK_TCK) as f64, ru)
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(Counters {
        busy: (cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6]) / hz,
        steal: cpu[7] / hz,
        children: secs(ru.ru_utime) + secs(ru.ru_stime),
    })
}

/// The 1-minute load average.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Started before a run, finished after its child process was waited for.
pub(crate) struct Probe {
    start: Instant,
    before: Option<Counters>,
    load: Option<f64>,
}

impl Probe {
    pub(crate) fn start() -> Self {
        Self {
            start: Instant::now(),
            before: counters(),
            load: load_average(),
        }
    }

    /// The run's share of the machine: `others` is the CPU time spent outside the run, in
    /// cores on average over its wall time, `steal` the host's; `starved` when the two
    /// together pass `limit` cores.
    pub(crate) fn finish(self, limit: f64) -> Value {
        let wall = self.start.elapsed().as_secs_f64();
        let (Some(a), Some(b)) = (self.before, counters()) else {
            return json!({"wall_s": wall, "load_average": self.load});
        };
        let own = b.children - a.children;
        let others = ((b.busy - a.busy - own) / wall).max(0.0);
        let steal = (b.steal - a.steal) / wall;
        json!({
            "wall_s": wall,
            "load_average": self.load,
            "own_cores": own / wall,
            "others_cores": others,
            "steal_cores": steal,
            "starved": others + steal > limit,
        })
    }
}

/// Whether a [`Probe::finish`] report says the run was starved.
pub(crate) fn starved(probe: &Value) -> bool {
    probe["starved"].as_bool().unwrap_or(false)
}

/// A report's table cell: others' CPU time plus steal, in cores, and "starved" if it was.
pub(crate) fn cell(probe: &Value) -> String {
    match (
        probe["others_cores"].as_f64(),
        probe["steal_cores"].as_f64(),
    ) {
        (Some(a), Some(b)) => {
            let mark = if starved(probe) { " starved" } else { "" };
            format!("{:.2}{mark}", a + b)
        }
        _ => "-".into(),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::Probe;

    /// A child that spins for a while is counted as the run's own time, not as others'.
    #[test]
    fn a_waited_child_counts_as_the_run() {
        let p = Probe::start();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let r = p.finish(f64::INFINITY);
        // CPU seconds, whatever else the machine ran meanwhile.
        let own = r["own_cores"].as_f64().unwrap() * r["wall_s"].as_f64().unwrap();
        assert!(own > 0.05, "the child's CPU time was not counted: {r}");
        assert_eq!(r["starved"], false);
    }
}
