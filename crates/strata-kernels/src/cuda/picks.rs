//! A step's tokens on the GPU: the argmax of each row of logits (`kernels/sampling.cu`),
//! sampled rows drawn over it (`kernels/draw.cu`), read back as one id a row (and, for rows
//! that want logprobs, a few words from which the host makes them), and fed to the next
//! step's ids on the device.
//!
//! A decode step's tokens can be left on the GPU ([`CudaTokens`]) with their copy to
//! page-locked host memory queued behind them: the host then queues the next step (whose
//! ids take these tokens with `feed_tokens`) before it waits for the copy, and the GPU goes
//! from one step to the next without waiting for the host.

use std::sync::Mutex;

use cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice, PushKernelArg};

use super::paged::CudaIndex;
use super::{device_err, CudaBackend, CudaBuffer};
use crate::error::ensure;
use crate::sampling::weight::{weight_shift, DrawSettings};
use crate::sampling::{Picked, RowDraw, RowMass, TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::{DeviceBuffer, Result};

/// Threads of an argmax block (`ARGMAX_THREADS` in `kernels/sampling.cu`) and the logits
/// each block takes (16 a thread).
const ARGMAX_THREADS: u32 = 512;
const ARGMAX_PER_BLOCK: usize = 16 * ARGMAX_THREADS as usize;
/// Rows an argmax slot holds at least (a graph bucket's worth); larger steps get larger
/// slots.
const MIN_SLOT_ROWS: usize = 256;
/// Slots kept for reuse: a step in flight, the one being read, and one to spare.
const KEPT_SLOTS: usize = 4;

/// An argmax's keys on the device and the page-locked host memory they are copied to. Kept
/// for reuse: allocating page-locked memory costs far more than a step's copy.
pub(super) struct ArgmaxSlot {
    keys: CudaSlice<u64>,
    host: PinnedHostSlice<u64>,
    /// `logprob_rows`' reports and their page-locked copy, allocated when a step first
    /// asks for logprobs.
    scores: Option<(CudaSlice<u64>, PinnedHostSlice<u64>)>,
    /// Recorded after the copy to `host`. The backend's context leaves event tracking off,
    /// so the pinned slice records none of its own: this is what a read waits for.
    copied: CudaEvent,
}

/// Threads of a draw's block (`DRAW_THREADS` in `kernels/draw.cu`): one block a drawn row.
const DRAW_THREADS: u32 = 1024;
/// Threads of a first-pass block (`DRAW_PASS_THREADS`), and the blocks the first pass aims
/// for over all drawn rows, whatever the rows: eight a multiprocessor of an H200, more than
/// are resident at once (at 104 rows, 0.04-0.1 ms a step less than two a multiprocessor:
/// more loads in flight to hide each value's exponential behind).
const DRAW_PASS_THREADS: u32 = 256;
const DRAW_PASS_BLOCKS: usize = 1056;
/// u64 words of a drawn row's first-pass histogram (`DRAW_HIST_WORDS`).
const DRAW_HIST_WORDS: usize = 2048 + 1024 + 5;
/// u64 words of one row's logprobs report (`LOGPROB_WORDS`).
const LOGPROB_WORDS: usize = 4 + MAX_TOP_LOGPROBS;

/// The first pass's output for the drawn rows of a step (histograms, each value's bin),
/// reused from step to step (the stream orders the steps' uses) and grown as needed.
pub(super) struct DrawScratch {
    hist: CudaSlice<u64>,
    bins: CudaSlice<u16>,
}

/// The backend's draw scratch, shared by its clones.
#[derive(Default)]
pub(super) struct DrawScratches(Mutex<Option<DrawScratch>>);
/// Flags of a draw's arguments (`DRAW_FILTERED`, `DRAW_TOP_P`, `DRAW_LOGPROBS`).
const DRAW_FILTERED: u64 = 1;
const DRAW_TOP_P: u64 = 2;
const DRAW_LOGPROBS: u64 = 4;

/// A draw's arguments as `draw_rows` reads them (`DRAW_ARG_WORDS` words): the uniform's 53
/// bits, top-p in 32-bit fixed point, row | top-k << 32, the bits of 1/temperature |
/// the bits of ln(min_p) << 32, flags.
fn draw_args(d: &RowDraw) -> [u64; 5] {
    let set = DrawSettings::new(&d.params);
    let min_rel = set.min_rel.unwrap_or(f32::NEG_INFINITY);
    let mut flags = 0;
    if set.filtered() {
        flags |= DRAW_FILTERED;
    }
    if set.top_p32.is_some() {
        flags |= DRAW_TOP_P;
    }
    [
        crate::sampling::weight::uniform_bits(d.uniform),
        set.top_p32.unwrap_or(0),
        d.row as u64 | (set.top_k.min(u32::MAX as usize) as u64) << 32,
        set.inv_t.to_bits() as u64 | (min_rel.to_bits() as u64) << 32,
        flags,
    ]
}

/// The arguments of a row's logprobs entry: a histogram of its raw values (1/temperature
/// 1, no filter) and `n` top candidates in the top-k word.
fn logprob_args(row: usize, n: usize) -> [u64; 5] {
    [
        0,
        0,
        row as u64 | (n as u64) << 32,
        1f32.to_bits() as u64 | (f32::NEG_INFINITY.to_bits() as u64) << 32,
        DRAW_FILTERED | DRAW_LOGPROBS,
    ]
}

/// Spare slots, shared by the backend's clones.
#[derive(Default)]
pub(super) struct ArgmaxSlots(Mutex<Vec<ArgmaxSlot>>);

/// A step's ids on the GPU (as `argmax_rows`'s keys), their copy to the host queued.
pub struct CudaTokens {
    slot: ArgmaxSlot,
    rows: usize,
    /// The rows whose logprobs were asked for and how many top ones, in report order.
    scored: Vec<(usize, usize)>,
    /// The fixed-point bits of the reports' totals.
    shift: u32,
}

impl CudaTokens {
    /// The argmax keys the tokens are read from (`0xffffffff - key` is row `r`'s id, as
    /// `feed_tokens` reads them), and their rows.
    pub(super) fn fed_keys(&self) -> (&CudaSlice<u64>, u32) {
        (&self.slot.keys, self.rows as u32)
    }
}

/// A row's logprobs from its `logprob_rows` report (`LOGPROB_WORDS` words), which must be
/// about the row's token `id`.
fn read_report(words: &[u64], n: usize, shift: u32, id: u32) -> Result<TokenLogprobs> {
    let value = |w: u64| f32::from_bits(w as u32);
    let mass = RowMass {
        best: value(words[0]),
        total: words[1],
        shift,
    };
    ensure((words[2] >> 32) as u32 == id, "logprob_rows", || {
        format!("a report about id {} for token {id}", words[2] >> 32)
    })?;
    let found = (words[3] as usize).min(n).min(MAX_TOP_LOGPROBS);
    let top: Vec<(u32, f32)> = words[4..4 + found]
        .iter()
        .map(|&w| ((w >> 32) as u32, value(w)))
        .collect();
    Ok(TokenLogprobs::from_values(&mass, value(words[2]), &top))
}

impl CudaBackend {
    /// A slot of at least `rows` keys, zeroed on the stream (the kernel folds into them).
    fn argmax_slot(&self, rows: usize) -> Result<ArgmaxSlot> {
        let spare = {
            let mut slots = self.argmax_slots.0.lock().expect("argmax slots lock");
            let at = slots.iter().position(|s| s.keys.len() >= rows);
            at.map(|i| slots.swap_remove(i))
        };
        let mut slot = match spare {
            Some(s) => s,
            None => {
                let n = rows.max(MIN_SLOT_ROWS).next_power_of_two();
                let (keys, host) = self.copied_words(n, "argmax ids")?;
                let copied = self
                    .ctx
                    .new_event(None)
                    .map_err(device_err("creating an argmax event"))?;
                ArgmaxSlot {
                    keys,
                    host,
                    scores: None,
                    copied,
                }
            }
        };
        self.stream
            .memset_zeros(&mut slot.keys.slice_mut(..rows))
            .map_err(device_err("zeroing argmax keys"))?;
        Ok(slot)
    }

    pub(super) fn pick_start_impl(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
        draws: &[RowDraw],
    ) -> Result<CudaTokens> {
        const OP: &str = "argmax_rows";
        ensure(vocab > 0 && logits.len() >= rows * vocab, OP, || {
            format!("{} logits for {rows} rows of {vocab}", logits.len())
        })?;
        let cap = softcap.unwrap_or(0.0);
        ensure(
            softcap.is_none() || cap > 0.0 && cap.is_finite(),
            OP,
            || format!("softcap {cap} must be positive and finite"),
        )?;
        ensure(vocab <= crate::sampling::FED_TOKEN as usize, OP, || {
            format!("a vocabulary of {vocab} ids does not fit the 31 bits of an id")
        })?;
        let mut slot = self.argmax_slot(rows)?;
        let mut scored = Vec::new();
        if rows > 0 {
            let xs = logits.f32s(OP)?;
            let v = vocab as u64;
            // Enough blocks a row that one row (batch 1) still spreads over the GPU.
            let parts = vocab.div_ceil(ARGMAX_PER_BLOCK).clamp(1, 64) as u32;
            let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
            // 0: raw values; 1: capped, only the values that may win computed.
            let has_cap = i32::from(softcap.is_some());
            l.arg(xs)
                .arg(&mut slot.keys)
                .arg(&v)
                .arg(&has_cap)
                .arg(&cap);
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, parts, 1),
                block_dim: (ARGMAX_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: logits hold at least rows x vocab values (checked); keys hold rows.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
            scored = self.draw_rows(xs, &mut slot, vocab, rows, softcap, draws)?;
            // Queued behind the kernels; `copied` marks its completion.
            self.stream
                .memcpy_dtoh(&slot.keys.slice(..rows), &mut slot.host)
                .map_err(device_err("copying argmax ids"))?;
            if let Some((dev, host)) = slot.scores.as_mut().filter(|_| !scored.is_empty()) {
                self.stream
                    .memcpy_dtoh(&dev.slice(..scored.len() * LOGPROB_WORDS), host)
                    .map_err(device_err("copying logprobs"))?;
            }
            slot.copied
                .record(&self.stream)
                .map_err(device_err("recording the argmax copy"))?;
        }
        Ok(CudaTokens {
            slot,
            rows,
            scored,
            shift: weight_shift(vocab),
        })
    }

    /// `len` words on the device, zeroed, and page-locked host memory they are copied to
    /// (`what` names them in errors).
    fn copied_words(
        &self,
        len: usize,
        what: &str,
    ) -> Result<(CudaSlice<u64>, PinnedHostSlice<u64>)> {
        let dev = self
            .stream
            .alloc_zeros::<u64>(len)
            .map_err(device_err(&format!("allocating {what}")))?;
        // SAFETY: the host side is only read after a copy into it has landed.
        let host = unsafe { self.ctx.alloc_pinned_with_flags::<u64>(len, 0) }
            .map_err(device_err(&format!("allocating page-locked {what}")))?;
        Ok((dev, host))
    }

    /// A slot's logprobs reports (`ArgmaxSlot::scores`), grown to hold `n`.
    fn score_buffers<'a>(
        &self,
        scores: &'a mut Option<(CudaSlice<u64>, PinnedHostSlice<u64>)>,
        n: usize,
    ) -> Result<&'a mut CudaSlice<u64>> {
        let words = n * LOGPROB_WORDS;
        if scores.as_ref().is_none_or(|(d, _)| d.len() < words) {
            let len = n.max(MIN_SLOT_ROWS).next_power_of_two() * LOGPROB_WORDS;
            *scores = Some(self.copied_words(len, "logprobs reports")?);
        }
        Ok(&mut scores.as_mut().expect("allocated above").0)
    }

    /// Draws the rows of `draws` over the argmax keys in `slot`, then reports the logprobs
    /// of the rows that ask for them; returns those rows and their top counts in report
    /// order.
    fn draw_rows(
        &self,
        xs: &cudarc::driver::CudaSlice<f32>,
        slot: &mut ArgmaxSlot,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
        draws: &[RowDraw],
    ) -> Result<Vec<(usize, usize)>> {
        const OP: &str = "draw_rows";
        let drawn: Vec<&RowDraw> = draws.iter().filter(|d| !d.params.is_greedy()).collect();
        let scored: Vec<(usize, usize)> = draws
            .iter()
            .filter_map(|d| Some((d.row, d.logprobs?)))
            .collect();
        if drawn.is_empty() && scored.is_empty() {
            return Ok(scored);
        }
        let mut args = Vec::with_capacity((drawn.len() + scored.len()) * 5);
        for d in draws {
            ensure(d.row < rows, OP, || {
                format!("a draw for row {} of {rows}", d.row)
            })?;
        }
        for d in &drawn {
            d.params.validate()?;
            args.extend(draw_args(d));
        }
        for &(row, n) in &scored {
            ensure(n <= MAX_TOP_LOGPROBS, OP, || {
                format!("{n} top logprobs (at most {MAX_TOP_LOGPROBS})")
            })?;
            args.extend(logprob_args(row, n));
        }
        ensure(vocab <= u32::MAX as usize, OP, || {
            format!("a vocabulary of {vocab}")
        })?;
        let args = self
            .stream
            .clone_htod(&args)
            .map_err(device_err("uploading draw settings"))?;
        let n = drawn.len() + scored.len();
        let mut guard = self.draw_scratch.0.lock().expect("draw scratch lock");
        let fits = guard
            .as_ref()
            .is_some_and(|s| s.hist.len() >= n * DRAW_HIST_WORDS && s.bins.len() >= n * vocab);
        if !fits {
            // Twice what this step needs, so a growing batch reallocates rarely.
            let cap = 2 * n;
            *guard = Some(DrawScratch {
                hist: self
                    .stream
                    .alloc_zeros::<u64>(cap * DRAW_HIST_WORDS)
                    .map_err(device_err("allocating draw histograms"))?,
                bins: self
                    .stream
                    .alloc_zeros::<u16>(cap * vocab)
                    .map_err(device_err("allocating draw bins"))?,
            });
        }
        let scratch = guard.as_mut().expect("allocated above");
        self.stream
            .memset_zeros(&mut scratch.hist.slice_mut(..n * DRAW_HIST_WORDS))
            .map_err(device_err("zeroing draw histograms"))?;
        let (v, shift) = (vocab as u32, weight_shift(vocab));
        let has_cap = i32::from(softcap.is_some());
        let cap = softcap.unwrap_or(0.0);
        // The first pass: each row in stretches of whole 128-id runs, over about
        // DRAW_PASS_BLOCKS blocks in all.
        let parts = DRAW_PASS_BLOCKS.div_ceil(n).clamp(1, vocab.div_ceil(128));
        let slice = 128 * vocab.div_ceil(128 * parts);
        let parts = vocab.div_ceil(slice);
        let slice_u = slice as u32;
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("draw_first_pass")?);
        l.arg(xs)
            .arg(&slot.keys)
            .arg(&args)
            .arg(&mut scratch.hist)
            .arg(&mut scratch.bins)
            .arg(&v)
            .arg(&has_cap)
            .arg(&cap)
            .arg(&shift)
            .arg(&slice_u);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, parts as u32, 1),
            block_dim: (DRAW_PASS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: each entry's row is below `rows` (checked), which the logits and keys hold;
        // the scratch holds n histograms and n rows of bins.
        unsafe { l.launch(cfg) }.map_err(device_err("draw_first_pass"))?;
        let blocks = |count: usize| LaunchConfig {
            grid_dim: (count as u32, 1, 1),
            block_dim: (DRAW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if !drawn.is_empty() {
            let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
            l.arg(xs)
                .arg(&mut slot.keys)
                .arg(&args)
                .arg(&scratch.hist)
                .arg(&scratch.bins)
                .arg(&v)
                .arg(&has_cap)
                .arg(&cap)
                .arg(&shift);
            // SAFETY: as above; the draws are the first entries.
            unsafe { l.launch(blocks(drawn.len())) }.map_err(device_err(OP))?;
        }
        if !scored.is_empty() {
            let first = drawn.len() as u32;
            let out = self.score_buffers(&mut slot.scores, scored.len())?;
            let mut l = self
                .stream
                .launch_builder(self.kernels.get("logprob_rows")?);
            l.arg(xs)
                .arg(&slot.keys)
                .arg(&args)
                .arg(&scratch.hist)
                .arg(&scratch.bins)
                .arg(out)
                .arg(&v)
                .arg(&has_cap)
                .arg(&cap)
                .arg(&shift)
                .arg(&first);
            // SAFETY: as above; the logprobs entries follow the draws, and `out` holds a
            // report for each.
            unsafe { l.launch(blocks(scored.len())) }.map_err(device_err("logprob_rows"))?;
        }
        Ok(scored)
    }

    pub(super) fn pick_finish_impl(&self, tokens: CudaTokens) -> Result<Vec<Picked>> {
        let CudaTokens {
            slot,
            rows,
            scored,
            shift,
        } = tokens;
        let picks = if rows == 0 {
            Ok(vec![])
        } else {
            slot.copied
                .synchronize()
                .map_err(device_err("waiting for argmax ids"))?;
            let keys = slot
                .host
                .as_slice()
                .map_err(device_err("reading argmax ids"))?;
            // The key's low half is the complemented index.
            let mut picks: Vec<Picked> = keys[..rows]
                .iter()
                .map(|&k| Picked {
                    id: u32::MAX - k as u32,
                    logprobs: None,
                })
                .collect();
            let reports = match (&slot.scores, scored.is_empty()) {
                (_, true) => Ok(&[][..]),
                (Some((_, host)), false) => host
                    .as_slice()
                    .map_err(device_err("reading logprobs reports")),
                (None, false) => Err(crate::KernelError::Device(
                    "logprobs asked for without reports".into(),
                )),
            };
            reports.and_then(|reports| {
                for (&(row, n), words) in scored.iter().zip(reports.chunks_exact(LOGPROB_WORDS)) {
                    picks[row].logprobs = Some(read_report(words, n, shift, picks[row].id)?);
                }
                Ok(picks)
            })
        };
        let mut slots = self.argmax_slots.0.lock().expect("argmax slots lock");
        if slots.len() < KEPT_SLOTS {
            slots.push(slot);
        }
        picks
    }

    pub(super) fn feed_tokens_impl(&self, ids: &mut CudaIndex, tokens: &CudaTokens) -> Result<()> {
        let n = ids.len();
        if n == 0 {
            return Ok(());
        }
        let (n_u, rows) = (n as u32, tokens.rows as u32);
        let mut l = self.stream.launch_builder(self.kernels.get("feed_tokens")?);
        l.arg(ids.data_mut())
            .arg(&tokens.slot.keys)
            .arg(&n_u)
            .arg(&rows);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).min(64) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: ids hold n values; a mark reads keys only below `rows`, which the keys hold.
        unsafe { l.launch(cfg) }.map_err(device_err("feed_tokens"))?;
        Ok(())
    }

    pub(super) fn clustered_argmax_impl(
        &self,
        logits: &CudaBuffer,
        scores: &CudaBuffer,
        ordering: &CudaIndex,
        c: crate::ClusterPick,
        out: &mut CudaIndex,
    ) -> Result<()> {
        const OP: &str = "clustered_argmax";
        // The kernel's shared arrays: every score's key, the chosen clusters.
        const MAX_CLUSTERS: usize = 4096;
        const MAX_TOP: usize = 256;
        ensure(
            (1..=MAX_CLUSTERS).contains(&c.clusters)
                && c.top_k <= MAX_TOP.min(c.clusters)
                && c.vocab == ordering.len()
                && c.vocab.is_multiple_of(c.clusters)
                && logits.len() >= c.rows * c.vocab
                && scores.len() >= c.rows * c.clusters
                && out.len() >= c.rows
                && c.vocab <= u32::MAX as usize,
            OP,
            || {
                format!(
                    "{c:?} over {} logits, {} scores, an ordering of {}, {} outputs (at most \
                     {MAX_CLUSTERS} clusters, {MAX_TOP} searched)",
                    logits.len(),
                    scores.len(),
                    ordering.len(),
                    out.len()
                )
            },
        )?;
        if c.rows == 0 {
            return Ok(());
        }
        let (vocab, clusters, top_k) = (c.vocab as u64, c.clusters as i32, c.top_k as i32);
        let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
        l.arg(logits.f32s(OP)?)
            .arg(scores.f32s(OP)?)
            .arg(ordering.data())
            .arg(out.data_mut())
            .arg(&vocab)
            .arg(&clusters)
            .arg(&top_k);
        let cfg = LaunchConfig {
            grid_dim: (c.rows as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the sizes were checked above; ordering's ids are below vocab (the caller
        // checked them when it made the index).
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}
