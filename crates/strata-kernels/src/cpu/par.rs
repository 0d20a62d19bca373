//! When to split work across rayon threads.

use rayon::prelude::*;

/// Below this many elements an elementwise or per-row op stays on the calling thread:
/// handing a decode-sized vector to the pool costs more than the arithmetic.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 14;

/// Calls `f(row_index, row)` for every `row_len` chunk of `data`, in parallel when large.
pub(crate) fn for_each_row_mut<F>(data: &mut [f32], row_len: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if data.len() >= PAR_MIN_ELEMS {
        data.par_chunks_mut(row_len)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    } else {
        data.chunks_mut(row_len)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    }
}

/// Elementwise `f(&mut a[i], b[i])`, in parallel when large.
pub(crate) fn zip_apply<F>(a: &mut [f32], b: &[f32], f: F)
where
    F: Fn(&mut f32, f32) + Sync + Send,
{
    const CHUNK: usize = 4096;
    let run = |(ac, bc): (&mut [f32], &[f32])| {
        for (x, &y) in ac.iter_mut().zip(bc) {
            f(x, y);
        }
    };
    if a.len() >= PAR_MIN_ELEMS {
        a.par_chunks_mut(CHUNK)
            .zip(b.par_chunks(CHUNK))
            .for_each(run);
    } else {
        run((a, b));
    }
}

/// Runs `f` on `len` floats of this thread's scratch, which keeps its allocation between
/// calls (the quantized matmul's row-major products, attention's converted value rows): a
/// prefill's products take megabytes a matmul, and a fresh allocation that size is new
/// pages from the kernel (faults and zeroing) every time. `f` must write
/// every value before reading it (the contents are a previous call's). A scratch past
/// [`SCRATCH_KEPT`] floats (a vocabulary-wide product over a long prompt) is freed after use.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local!(static SCRATCH: Scratch = const { std::cell::RefCell::new(Vec::new()) });
    with_scratch_in(&SCRATCH, len, f)
}

/// A thread's scratch slot. Code that holds a scratch while calling code that takes
/// [`with_scratch`]'s passes its own slot to [`with_scratch_in`], so neither call allocates
/// afresh.
pub(crate) type Scratch = std::cell::RefCell<Vec<f32>>;

/// [`with_scratch`] on the scratch `slot`.
pub(crate) fn with_scratch_in<R>(
    slot: &'static std::thread::LocalKey<Scratch>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    // Taken out while in use, so a nested call on this thread starts its own.
    let mut v = slot.with(|s| s.take());
    if v.len() < len {
        v.resize(len, 0.0);
    }
    let r = f(&mut v[..len]);
    if v.len() <= SCRATCH_KEPT {
        slot.with(|s| *s.borrow_mut() = v);
    }
    r
}

/// The most floats a thread's scratch keeps between calls (32 MiB).
const SCRATCH_KEPT: usize = 8 << 20;
