//! Items of concurrent callers gathered into shared passes (the vision tower's: one pass
//! over several requests' images uses the device better than a pass each).
//!
//! A caller queues its items and waits. Whichever waiting caller finds no pass running
//! runs the next one, over every queued job up to a cap of items, and hands each job its
//! results, then takes its own if they came. No thread of its own and no timer: a job waits
//! at most for the pass running when it came and the one after it, and a lone caller runs
//! its pass at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TryRecvError};
use std::sync::{Mutex, MutexGuard};

use crate::{EngineError, Result};

/// One caller's items and where its results go.
struct Job<T, R> {
    items: Vec<T>,
    reply: SyncSender<Result<Vec<R>>>,
}

/// Gathers callers' items into passes of at most `max_items` (a larger job runs alone).
pub(crate) struct Combiner<T, R> {
    queue: Mutex<VecDeque<Job<T, R>>>,
    pass: Mutex<()>,
    max_items: usize,
    passes: AtomicU64,
    items: AtomicU64,
}

fn lock<X>(m: &Mutex<X>) -> MutexGuard<'_, X> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T, R> Combiner<T, R> {
    pub(crate) fn new(max_items: usize) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            pass: Mutex::new(()),
            max_items: max_items.max(1),
            passes: AtomicU64::new(0),
            items: AtomicU64::new(0),
        }
    }

    /// (passes run, items they took).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.passes.load(Ordering::Relaxed),
            self.items.load(Ordering::Relaxed),
        )
    }

    /// `items`' results, from a pass of `pass` (one result an item, in order) that may also
    /// carry other callers' items. When a shared pass fails, each of its jobs runs again
    /// alone, so that one caller's bad item fails that caller only.
    pub(crate) fn run(
        &self,
        items: Vec<T>,
        pass: &dyn Fn(&[T]) -> Result<Vec<R>>,
    ) -> Result<Vec<R>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = sync_channel(1);
        lock(&self.queue).push_back(Job { items, reply });
        let take = |rx: &std::sync::mpsc::Receiver<Result<Vec<R>>>| match rx.try_recv() {
            Ok(r) => Some(r),
            Err(TryRecvError::Empty) => None,
            // The pass that took the job panicked before answering it.
            Err(TryRecvError::Disconnected) => Some(Err(EngineError::Internal(
                "the pass that took these items failed".into(),
            ))),
        };
        loop {
            if let Some(r) = take(&rx) {
                return r;
            }
            let _running = lock(&self.pass);
            // A pass that took this job finished before the lock came free.
            if let Some(r) = take(&rx) {
                return r;
            }
            let jobs = self.next_jobs();
            self.serve(jobs, pass);
        }
    }

    /// The queue's front jobs, as many as fit `max_items` (at least one).
    fn next_jobs(&self) -> Vec<Job<T, R>> {
        let mut q = lock(&self.queue);
        let mut jobs = Vec::new();
        let mut n = 0;
        while let Some(j) = q.front() {
            if !jobs.is_empty() && n + j.items.len() > self.max_items {
                break;
            }
            n += j.items.len();
            jobs.extend(q.pop_front());
        }
        jobs
    }

    fn serve(&self, jobs: Vec<Job<T, R>>, pass: &dyn Fn(&[T]) -> Result<Vec<R>>) {
        if jobs.is_empty() {
            return;
        }
        let counts: Vec<usize> = jobs.iter().map(|j| j.items.len()).collect();
        let mut replies = Vec::with_capacity(jobs.len());
        let mut all = Vec::with_capacity(counts.iter().sum());
        for j in jobs {
            all.extend(j.items);
            replies.push(j.reply);
        }
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(all.len() as u64, Ordering::Relaxed);
        let checked = |r: Result<Vec<R>>, want: usize| match r {
            Ok(v) if v.len() != want => Err(EngineError::Internal(format!(
                "a pass gave {} results for {want} items",
                v.len()
            ))),
            other => other,
        };
        let result = checked(pass(&all), all.len());
        match result {
            Ok(out) => {
                let mut out = out.into_iter();
                for (reply, n) in replies.into_iter().zip(counts) {
                    // A caller that went away drops its receiver; nothing to do.
                    let _ = reply.send(Ok(out.by_ref().take(n).collect()));
                }
            }
            Err(e) if replies.len() == 1 => {
                let _ = replies[0].send(Err(e));
            }
            Err(_) => {
                let mut at = 0;
                for (reply, n) in replies.into_iter().zip(counts) {
                    self.passes.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.send(checked(pass(&all[at..at + n]), n));
                    at += n;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Three jobs queued before any pass runs are served by one pass, each with its own
    /// results in order; the cap splits a queue into several passes.
    #[test]
    fn queued_jobs_share_one_pass() {
        let c: Combiner<u32, u32> = Combiner::new(5);
        let double = |v: &[u32]| -> Result<Vec<u32>> { Ok(v.iter().map(|x| 2 * x).collect()) };
        // Hold the pass so that the callers queue up behind it.
        let held = lock(&c.pass);
        std::thread::scope(|s| {
            let handles: Vec<_> = [vec![1, 2], vec![3], vec![4, 5], vec![6, 7, 8]]
                .into_iter()
                .map(|items| {
                    let c = &c;
                    s.spawn(move || c.run(items, &double).unwrap())
                })
                .collect();
            while lock(&c.queue).len() < 4 {
                std::thread::yield_now();
            }
            drop(held);
            let got: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(got, [vec![2, 4], vec![6], vec![8, 10], vec![12, 14, 16]]);
        });
        // 2 + 1 + 2 items fit the cap of 5; the last job takes a second pass.
        assert_eq!(c.counts(), (2, 8));
    }

    /// A failing shared pass runs each job alone: the job with the bad item fails, the
    /// others get their results.
    #[test]
    fn a_bad_item_fails_its_own_caller_only() {
        let c = Arc::new(Combiner::<i32, i32>::new(100));
        let pass = |v: &[i32]| -> Result<Vec<i32>> {
            if v.contains(&-1) {
                Err(EngineError::Invalid("negative".into()))
            } else {
                Ok(v.to_vec())
            }
        };
        let held = lock(&c.pass);
        std::thread::scope(|s| {
            let good = s.spawn(|| c.run(vec![1, 2], &pass));
            let bad = s.spawn(|| c.run(vec![3, -1], &pass));
            while lock(&c.queue).len() < 2 {
                std::thread::yield_now();
            }
            drop(held);
            assert_eq!(good.join().unwrap().unwrap(), [1, 2]);
            assert!(bad.join().unwrap().is_err());
        });
        // The shared pass, then one alone for each job.
        assert_eq!(c.counts().0, 3);
    }

    /// A lone caller runs its own pass; no items, no pass.
    #[test]
    fn a_lone_caller_runs_at_once() {
        let c: Combiner<u8, u8> = Combiner::new(4);
        let id = |v: &[u8]| -> Result<Vec<u8>> { Ok(v.to_vec()) };
        assert_eq!(c.run(vec![9], &id).unwrap(), [9]);
        assert!(c.run(vec![], &id).unwrap().is_empty());
        // A job past the cap runs alone rather than never.
        assert_eq!(c.run(vec![1; 6], &id).unwrap(), [1; 6]);
        assert_eq!(c.counts(), (2, 7));
        // A pass that gives the wrong count is an error, not a short answer.
        let short = |_: &[u8]| -> Result<Vec<u8>> { Ok(vec![]) };
        assert!(c.run(vec![1], &short).is_err());
    }
}
