//! Slots for the tokens of a step, and preemption when the pool runs out.

use strata_kv::{KvError, KvStorage};

use crate::{Event, FinishReason, Scheduler, StepModel};

/// What became of a request asked to take slots for this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reserved {
    /// Slots for this many tokens are allocated; the request is in the batch.
    Tokens(usize),
    /// Nothing fits now; the request keeps its pages and waits for a later step.
    Skipped,
    /// The request left the running set (requeued, or finished with an error).
    Removed,
}

impl<M: StepModel<S>, S: KvStorage> Scheduler<M, S> {
    /// Allocates slots for up to `want` tokens of running request `i`.
    ///
    /// The pool already evicts unused cached prefixes when short. Past that, a prefill
    /// chunk shrinks; then younger requests not yet in this step's batch are preempted,
    /// youngest first (requests in the batch are never touched, so the batch stays
    /// valid). A decode token that still does not fit preempts its own request; a prefill
    /// chunk waits if others are making progress this step.
    pub(crate) fn reserve(&mut self, i: usize, want: usize, events: &mut Vec<Event>) -> Reserved {
        let decode = self.running[i].pending() == 1;
        let mut n = want;
        loop {
            let Some(kv) = self.running[i].kv else {
                unreachable!("running requests hold a pool request")
            };
            match self.pool.extend(kv, n) {
                Ok(_) => {
                    self.running[i].chunk = Some(n);
                    return Reserved::Tokens(n);
                }
                Err(KvError::OutOfPages { .. }) => {}
                Err(e) => {
                    let seq = self.running.remove(i);
                    events.push(self.finish(seq, FinishReason::Error(e.to_string())));
                    return Reserved::Removed;
                }
            }
            // A smaller chunk still makes progress and costs nobody their work.
            if n > 1 {
                n /= 2;
                continue;
            }
            let victim = (i + 1..self.running.len())
                .rev()
                .find(|&j| self.running[j].chunk.is_none());
            if let Some(j) = victim {
                self.preempt(j);
                n = want;
                continue;
            }
            if self.running.len() == 1 {
                self.out_of_pages_alone(events);
                return Reserved::Removed;
            }
            let batch_empty = self.running.iter().all(|s| s.chunk.is_none());
            if !decode && !batch_empty {
                return Reserved::Skipped;
            }
            self.preempt(i);
            return Reserved::Removed;
        }
    }

    /// Frees the pages of running request `j` and puts it at the head of the queue. Its
    /// computed prefix goes to the cache first, so if nobody needs those pages before it
    /// is readmitted, it gets them back instead of recomputing.
    pub(crate) fn preempt(&mut self, j: usize) {
        let mut seq = self.running.remove(j);
        if let Some(kv) = seq.kv {
            if self.caching() {
                let _ = self.pool.cache_prefix(kv, &seq.cache_key(seq.computed));
            }
            let released = self.pool.release(kv);
            debug_assert!(released.is_ok(), "release of a running request failed");
        }
        seq.reset_for_requeue();
        self.waiting.push_front(seq);
        self.preemptions += 1;
    }

    /// The only running request is out of pages after eviction. What is left in the cache
    /// is its own pinned prefix (or window pages of it); restart it once on an empty
    /// cache, and if that does not fit either, it never will.
    fn out_of_pages_alone(&mut self, events: &mut Vec<Event>) {
        let mut seq = self.running.remove(0);
        if seq.restarted_alone {
            let reason = FinishReason::Error(format!(
                "the request ({} tokens so far) does not fit in the KV pool",
                seq.tokens.len()
            ));
            events.push(self.finish(seq, reason));
            return;
        }
        if let Some(kv) = seq.kv {
            let released = self.pool.release(kv);
            debug_assert!(released.is_ok(), "release of a running request failed");
        }
        self.pool.flush_cache();
        seq.reset_for_requeue();
        seq.restarted_alone = true;
        self.waiting.push_front(seq);
        self.preemptions += 1;
    }
}
