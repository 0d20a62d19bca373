//! Decode steps as captured graphs (CUDA graphs on the GPU).
//!
//! A decode step (every sequence feeds one token and wants its last logits) runs the same
//! ops in the same order every time; only the token ids, positions and slot tables change.
//! So the first step of a batch-size bucket (1, 2, 4, 8, 16 sequences, multiples of 4 up
//! to 128, of 16 up to 256: [`bucket_for`]) is captured once:
//! inputs live in buffers the graph owns (fixed addresses), the step's ops are recorded,
//! and the logits land in a buffer the graphs share. Later steps of that bucket only
//! rewrite the inputs in place and replay: one launch instead of hundreds. The slot tables
//! go as each sequence's pages, which the backend expands into the graph's tables (a page
//! id per 16 keys crosses from the host, not a slot per key).
//!
//! A batch smaller than its bucket is padded with rows that feed token 0 at position 0,
//! store their K/V in the slab's spare slot (one past the plan's) and attend to it alone;
//! their logits are dropped. The full group's slot table has a capacity; a step that
//! needs more recaptures the bucket with twice the room.

use strata_kernels::{
    expand_page_slots, lora_slot_index, Backend, DeviceBuffer, PagedSeq, StridedCopy,
};
use strata_kv::{KvPool, PoolKind, RequestId};

use crate::batch::{ForwardBatch, LogitsMode, SeqChunk};
use crate::error::Result;
use crate::forward::{HiddenOut, Prepared, SeqRows, StepInputs};
use crate::greedy_rows::{pick_rows, GreedyRows, RowChoices};
use crate::launch::{all_picked, Launched};
use crate::model::Model;
use crate::paged_kv::{host_pages, DecodeGraphs, GroupTables, HostPages, PagedStorage};

/// Largest batch replayed as a graph; larger decode batches run op by op.
pub(crate) const MAX_GRAPH_BATCH: usize = 256;
/// Buckets are powers of two up to this many sequences, multiples of [`BUCKET_STEP`] past
/// it up to [`STEPPED_BUCKETS_UP_TO`], multiples of [`WIDE_BUCKET_STEP`] past that.
const POW2_BUCKETS_UP_TO: usize = 16;
/// A padded row costs about 10 us of a step at these sizes (its norms, RoPE, attention and
/// logits): at 97 sequences E2B's step took 3.86 ms in the 104-row graph, 3.84 in the
/// 100-row one and 3.81 in a 97-row one (H200, depth 768). The graphs share their logits
/// buffer, so a bucket costs its capture and its small input tables.
const BUCKET_STEP: usize = 4;
const STEPPED_BUCKETS_UP_TO: usize = 128;
/// Past 128 sequences a row is a smaller share of the step.
const WIDE_BUCKET_STEP: usize = 16;
/// Smallest slot capacity of a graph's full-attention table.
const MIN_SLOT_CAPACITY: usize = 1 << 16;

/// The graph bucket of a decode step of `n` sequences. Every padded row costs its share of
/// the step (its products, norms and logits), so past 16 sequences buckets step by 4, and
/// past 128 by 16: 97 sequences replay the 100-row graph.
pub fn bucket_for(n: usize) -> usize {
    if n <= POW2_BUCKETS_UP_TO || n > MAX_GRAPH_BATCH {
        n.next_power_of_two()
    } else if n <= STEPPED_BUCKETS_UP_TO {
        n.next_multiple_of(BUCKET_STEP)
    } else {
        n.next_multiple_of(WIDE_BUCKET_STEP)
    }
}

/// Every bucket a decode step of up to `max` sequences can take (all of them, when `max`
/// is past the largest graph), smallest first.
pub fn decode_buckets(max: usize) -> Vec<usize> {
    let mut buckets = Vec::new();
    let mut n = 1;
    while n <= max.min(MAX_GRAPH_BATCH) {
        let b = bucket_for(n);
        buckets.push(b);
        n = b + 1;
    }
    buckets
}

/// One captured bucket.
pub(crate) struct DecodeGraph<B: Backend> {
    graph: B::Graph,
    inputs: StepInputs<B>,
    full: Option<GroupTables<B>>,
    window: Option<GroupTables<B>>,
    /// Which of the storage's logits buffers it writes (`PagedStorage::graph_logits`), and
    /// how many rows (a row a token).
    logits: usize,
    rows: usize,
    /// A verification graph's `[rows, hidden]` final-normed rows.
    hidden: Option<B::Buffer>,
    full_capacity: usize,
    window_capacity: usize,
    /// The LoRA set's generation at capture (its stacks' buffers are in the graph).
    lora_generation: u64,
}

/// The step's host inputs, padded to `bucket` rows; each group's keys as pages (what a
/// replay uploads; a capture expands them into slot tables).
pub(crate) struct Padded {
    pub(crate) ids: Vec<u32>,
    pub(crate) positions: Vec<u32>,
    pub(crate) full: Option<HostPages>,
    pub(crate) window: Option<HostPages>,
    /// Each row's LoRA slot (pads: none) and the rows in slot order ([`lora_slot_index`]);
    /// `None` when no sequence has an adapter.
    pub(crate) lora: Option<Vec<u32>>,
}

/// The padded step's inputs with each row's LoRA slot (the adapters put in the stacks).
fn padded_with_slots<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    model: &Model<B>,
    (batch, prep): (&ForwardBatch, &Prepared),
    bucket: usize,
) -> Result<Padded> {
    let mut p = padded(pool, batch, prep, bucket)?;
    p.lora = model.loras.slots_for(model.backend(), batch)?.map(|mut v| {
        v.resize(p.ids.len(), u32::MAX);
        lora_slot_index(&v)
    });
    Ok(p)
}

/// Pads a group's pages with rows of `q` tokens (positions 0 .. q) on the spare page, the
/// first one past the plan's: pad token `j` writes and reads slot `spare + j`.
fn pad_pages(t: &mut HostPages, (n, bucket, q): (usize, usize, usize), spare: u32, page_size: u32) {
    debug_assert_eq!(spare % page_size, 0, "the plan's slots are whole pages");
    // Only a bucket with pads needs them to fit (`eligible` lets a verification of more
    // tokens than a page through when its batch fills its bucket).
    debug_assert!(
        n == bucket || q <= page_size as usize,
        "a pad's tokens fit the spare page"
    );
    for row in n..bucket {
        t.store.extend((0..q as u32).map(|j| spare + j));
        t.seqs.push(PagedSeq {
            q_offset: row * q,
            q_len: q,
            q_start: 0,
            k_start: 0,
            slot_offset: t.keys,
        });
        t.page_start.push(t.pages.len() as u32);
        t.pages.push(spare / page_size);
        t.keys += q;
    }
}

/// Whether `batch` can replay a graph: a decode step (one token a sequence), or with
/// `rows` a verification step (every sequence `q` tokens, every row's logits; padded to
/// its bucket with pads of `q` tokens where a pad's tokens fit the spare page).
fn eligible<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    model: &Model<B>,
    batch: &ForwardBatch,
    rows: bool,
) -> bool {
    let n = batch.seqs.len();
    let q = batch.seqs.first().map_or(0, |s| s.tokens.len());
    let shape = match rows {
        false => batch.seqs.iter().all(|s| {
            s.tokens.len() == 1
                && matches!(
                    s.logits,
                    LogitsMode::Last | LogitsMode::Argmax | LogitsMode::Draw { .. }
                )
        }),
        true => {
            (bucket_for(n) == n || q <= pool.plan().page_size)
                && batch
                    .seqs
                    .iter()
                    .all(|s| s.tokens.len() == q && s.logits == LogitsMode::All)
        }
    };
    // A step with rows given as embeddings runs op by op (a graph replays only token
    // lookups). LoRA adapters replay: each row's slot is an input of the graph.
    pool.storage().graph_mode != DecodeGraphs::Off
        && batch.embeds.is_empty()
        && model.backend().supports_graphs()
        && !model.has_host_tables()
        && (1..=MAX_GRAPH_BATCH).contains(&n)
        && shape
}

pub(crate) fn padded<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    batch: &ForwardBatch,
    prep: &Prepared,
    bucket: usize,
) -> Result<Padded> {
    let n = batch.seqs.len();
    let q = batch.seqs[0].tokens.len();
    let plan = *pool.plan();
    let mut p = Padded {
        ids: prep.ids.clone(),
        positions: prep.positions.clone(),
        full: None,
        window: None,
        lora: None,
    };
    // Pads of q tokens (`eligible`: one for a decode step, a verification's run), token 0
    // at positions 0 .. q.
    p.ids.resize(bucket * q, 0);
    p.positions.extend((n..bucket).flat_map(|_| 0..q as u32));
    for g in pool.layout().groups() {
        let mut t = host_pages(pool, g.pool, g.window, batch)?;
        let spare = plan.slots(g.pool) as u32;
        pad_pages(&mut t, (n, bucket, q), spare, plan.page_size as u32);
        match g.pool {
            PoolKind::Full => p.full = Some(t),
            PoolKind::Window => p.window = Some(t),
        }
    }
    Ok(p)
}

/// The padded batch the captured ops see: real sequences, then pads of as many tokens
/// wanting what the sequences want (every row's logits for a verification, none for a
/// draft round), or the last row's for a decode step (pads are not drawn).
pub(crate) fn padded_batch(batch: &ForwardBatch, bucket: usize) -> ForwardBatch {
    let q = batch.seqs[0].tokens.len();
    let logits = match batch.seqs[0].logits {
        LogitsMode::All => LogitsMode::All,
        LogitsMode::None => LogitsMode::None,
        _ => LogitsMode::Last,
    };
    let mut seqs = batch.seqs.clone();
    seqs.extend((batch.seqs.len()..bucket).map(|_| SeqChunk {
        request: RequestId(u64::MAX),
        tokens: vec![0; q],
        start: 0,
        logits,
    }));
    ForwardBatch {
        embeds: Vec::new(),
        seqs,
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    }
}

fn padded_prep(p: &Padded, q: usize) -> Prepared {
    Prepared {
        ids: p.ids.clone(),
        positions: p.positions.clone(),
        rows: (0..p.ids.len() / q)
            .map(|i| SeqRows {
                offset: i * q,
                len: q,
            })
            .collect(),
    }
}

/// Copies the first `len` elements of `src` into `dst`.
pub(crate) fn copy_prefix<B: Backend>(
    b: &B,
    src: &B::Buffer,
    dst: &mut B::Buffer,
    len: usize,
) -> Result<()> {
    let c = StridedCopy {
        rows: 1,
        cols: len,
        src_offset: 0,
        src_stride: 0,
        dst_offset: 0,
        dst_stride: 0,
    };
    Ok(b.copy_strided(src, dst, c)?)
}

/// A group's tables in buffers of their own, the slots expanded from the pages on the host
/// (a capture, once a bucket).
fn tables_with_capacity<B: Backend>(
    b: &B,
    t: &Option<HostPages>,
    page_size: usize,
    capacity: usize,
) -> Result<Option<GroupTables<B>>> {
    t.as_ref()
        .map(|t| {
            let slots = expand_page_slots(&t.seqs, &t.pages, &t.page_start, page_size)?;
            Ok(GroupTables {
                store: b.upload_index(&t.store)?,
                batch: b.paged_batch_with_capacity(&t.seqs, &slots, capacity)?,
            })
        })
        .transpose()
}

/// The padded step's inputs uploaded (fed ids filled in from `fed`), and the pool's tables
/// set to the graph's (with their capacities: graph batches take the split counts of long
/// keys).
pub(crate) fn graph_inputs<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    b: &B,
    (p, fed): (&Padded, Option<&B::Tokens>),
    full_capacity: usize,
    window_capacity: usize,
) -> Result<StepInputs<B>> {
    let mut inputs = StepInputs {
        ids: b.upload_index(&p.ids)?,
        positions: b.upload_index(&p.positions)?,
        lora: p.lora.as_ref().map(|v| b.upload_index(v)).transpose()?,
    };
    if let Some(tokens) = fed {
        b.feed_tokens(&mut inputs.ids, tokens)?;
    }
    let page_size = pool.plan().page_size;
    let st = pool.storage_mut();
    st.full = tables_with_capacity(b, &p.full, page_size, full_capacity)?;
    st.window = tables_with_capacity(b, &p.window, page_size, window_capacity)?;
    Ok(inputs)
}

/// Runs the padded step op by op on `graph_inputs`' tables, its `[bucket, vocab]` logits
/// written straight into `logits` (a graph's own buffer: no copy after the step).
fn run_padded<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    model: &Model<B>,
    batch: &ForwardBatch,
    (p, bucket): (&Padded, usize),
    inputs: &StepInputs<B>,
    (logits, hidden): (&mut B::Buffer, Option<&mut B::Buffer>),
) -> Result<()> {
    let pb = padded_batch(batch, bucket);
    let q = batch.seqs[0].tokens.len();
    let hidden = hidden.map(HiddenOut::Into);
    model.run(pool, &pb, &padded_prep(p, q), inputs, Some(logits), hidden)?;
    Ok(())
}

/// The storage's newest logits buffer at `len` elements, taken out of the storage for a
/// capture ([`capture`] puts it back), with its index. Captured graphs share it: replays
/// run one after another on the stream, and each step's logits are read (argmax, draws,
/// copies) before the next is queued. When it is too small a larger one is added; the
/// graphs captured on the old one keep it, and at the next growth it is freed if none of
/// them is left (in stream order, after any replay still queued).
/// The server's warm-up captures its largest bucket first, so decode graphs share one.
fn take_graph_logits<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    b: &B,
    len: usize,
) -> Result<(usize, B::Buffer)> {
    let st = pool.storage_mut();
    let fits = matches!(st.graph_logits.last(), Some(Some(l)) if l.capacity() >= len);
    if !fits {
        let used: std::collections::HashSet<usize> = st.graphs.values().map(|g| g.logits).collect();
        for (i, l) in st.graph_logits.iter_mut().enumerate() {
            if !used.contains(&i) {
                *l = None;
            }
        }
        st.graph_logits
            .push(Some(b.zeros(len, b.activation_dtype())?));
    }
    let i = st.graph_logits.len() - 1;
    let mut logits = st.graph_logits[i]
        .take()
        .expect("the newest buffer is in place");
    logits.set_len(len)?;
    Ok((i, logits))
}

/// The logits buffer graph `key` writes, at its length.
fn graph_logits<'a, B: Backend>(
    pool: &'a mut KvPool<PagedStorage<B>>,
    vocab: usize,
    key: &GraphKey,
) -> Result<&'a mut B::Buffer> {
    let st = pool.storage_mut();
    let g = &st.graphs[key];
    let (i, rows) = (g.logits, g.rows);
    let logits = st.graph_logits[i]
        .as_mut()
        .expect("a captured graph's logits buffer stays in the storage");
    logits.set_len(rows * vocab)?;
    Ok(logits)
}

/// Records the bucket's graph. The step's K/V is written by a warm-up pass run op by op
/// first (which also settles library workspaces before capture); the replay that follows
/// writes the same values again.
fn capture<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    model: &Model<B>,
    batch: &ForwardBatch,
    (p, fed): (&Padded, Option<&B::Tokens>),
    bucket: usize,
    full_capacity: usize,
    window_capacity: usize,
) -> Result<DecodeGraph<B>> {
    let b = model.backend();
    let (vocab, h) = (model.config().vocab_size, model.config().hidden_size);
    let inputs = graph_inputs(pool, b, (p, fed), full_capacity, window_capacity)?;
    // A row a token: one a sequence for decode, all of them for a verification.
    let rows = p.ids.len();
    let (slot, mut logits) = take_graph_logits(pool, b, rows * vocab)?;
    let mut hidden = match verifies(batch) {
        true => Some(b.zeros(rows * h, b.activation_dtype())?),
        false => None,
    };
    let mut outs = |l: &mut B::Buffer, h: &mut Option<B::Buffer>| {
        run_padded(pool, model, batch, (p, bucket), &inputs, (l, h.as_mut()))
    };
    let recorded = outs(&mut logits, &mut hidden).and_then(|()| {
        b.begin_capture()?;
        let recorded = outs(&mut logits, &mut hidden);
        // End the capture whatever happened, so the stream is usable again.
        let graph = b.end_capture();
        recorded?;
        Ok(graph?)
    });
    // Back whatever happened: the graphs captured before write it.
    let st = pool.storage_mut();
    st.graph_logits[slot] = Some(logits);
    Ok(DecodeGraph {
        graph: recorded?,
        inputs,
        full: st.full.take(),
        window: st.window.take(),
        logits: slot,
        rows,
        hidden,
        full_capacity,
        window_capacity,
        lora_generation: model.loras.generation(),
    })
}

/// Rewrites a captured bucket's inputs for this step. The slot tables go as pages, which
/// the backend expands where the graph reads them: at 112 rows and depth 768 the slot
/// tables were 143,000 values built and copied by the host every step (0.2 ms with the GPU
/// idle), the pages are about 9,000.
fn update<B: Backend>(
    b: &B,
    g: &mut DecodeGraph<B>,
    (p, fed): (&Padded, Option<&B::Tokens>),
    page_size: usize,
) -> Result<()> {
    b.write_index(&mut g.inputs.ids, &p.ids)?;
    if let Some(tokens) = fed {
        b.feed_tokens(&mut g.inputs.ids, tokens)?;
    }
    b.write_index(&mut g.inputs.positions, &p.positions)?;
    if let (Some(slots), Some(host)) = (g.inputs.lora.as_mut(), p.lora.as_ref()) {
        b.write_index(slots, host)?;
    }
    for (tables, host) in [(&mut g.full, &p.full), (&mut g.window, &p.window)] {
        if let (Some(t), Some(h)) = (tables.as_mut(), host.as_ref()) {
            b.write_index(&mut t.store, &h.store)?;
            b.paged_batch_update_pages(&mut t.batch, &h.seqs, &h.pages, &h.page_start, page_size)?;
        }
    }
    Ok(())
}

/// A captured graph's key: its bucket, the tokens each sequence feeds (1 for decode),
/// whether it keeps every row's logits and final-normed state (a verification step), and
/// whether it runs the LoRA products (over the stacks of the generation it was captured at).
pub(crate) type GraphKey = (usize, usize, bool, bool);

/// Whether `batch` (graph-eligible) is a verification step: every row's logits, and the
/// rows' final-normed states kept.
fn verifies(batch: &ForwardBatch) -> bool {
    batch.seqs[0].logits == LogitsMode::All
}

/// Slot capacity for `need` keys, at least twice what a graph had before.
pub(crate) fn grow(need: usize, had: Option<usize>) -> usize {
    (2 * need)
        .max(MIN_SLOT_CAPACITY)
        .max(had.map_or(0, |h| 2 * h))
}

/// Replays the graph of `batch`'s shape (capturing it first when there is none, or when
/// its slot tables are too small), with `p` as its inputs.
fn replay_graph<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    model: &Model<B>,
    batch: &ForwardBatch,
    (p, fed): (&Padded, Option<&B::Tokens>),
    bucket: usize,
) -> Result<GraphKey> {
    let b = model.backend();
    let key = (
        bucket,
        batch.seqs[0].tokens.len(),
        verifies(batch),
        p.lora.is_some(),
    );
    let generation = model.loras.generation();
    let page_size = pool.plan().page_size;
    let keys = |t: &Option<HostPages>| t.as_ref().map_or(0, |t| t.keys);
    let (need_full, need_window) = (keys(&p.full), keys(&p.window));
    let fits = pool.storage().graphs.get(&key).is_some_and(|g| {
        need_full <= g.full_capacity
            && need_window <= g.window_capacity
            && (!key.3 || g.lora_generation == generation)
    });
    if !fits {
        let old = pool.storage_mut().graphs.remove(&key);
        let full_cap = grow(need_full, old.as_ref().map(|g| g.full_capacity));
        let window_cap = grow(need_window, old.as_ref().map(|g| g.window_capacity));
        drop(old);
        let g = capture(pool, model, batch, (p, fed), bucket, full_cap, window_cap)?;
        pool.storage_mut().graphs.insert(key, g);
    }
    let g = pool
        .storage_mut()
        .graphs
        .get_mut(&key)
        .expect("captured above");
    update(b, g, (p, fed), page_size)?;
    b.launch_graph(&g.graph)?;
    Ok(key)
}

/// Replays (capturing first when needed) the graph for `batch`'s bucket; `None` when the
/// batch is not a graph-eligible decode step.
pub(crate) fn replay<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    model: &Model<B>,
    batch: &ForwardBatch,
    prep: &Prepared,
    fed: Option<&B::Tokens>,
) -> Result<Option<Launched<B>>> {
    if !eligible(pool, model, batch, false) {
        return Ok(None);
    }
    let b = model.backend();
    let bucket = bucket_for(batch.seqs.len());
    let p = padded_with_slots(pool, model, (batch, prep), bucket)?;
    if pool.storage().graph_mode == DecodeGraphs::Unrecorded {
        let keys = |t: &Option<HostPages>| t.as_ref().map_or(0, |t| t.keys);
        let (full_cap, window_cap) = (grow(keys(&p.full), None), grow(keys(&p.window), None));
        let inputs = graph_inputs(pool, b, (&p, fed), full_cap, window_cap)?;
        let vocab = model.config().vocab_size;
        let mut logits = b.scratch(bucket * vocab, b.activation_dtype())?;
        let ran = run_padded(
            pool,
            model,
            batch,
            (&p, bucket),
            &inputs,
            (&mut logits, None),
        );
        let st = pool.storage_mut();
        (st.full, st.window) = (None, None);
        ran?;
        return step_output(model, batch, &mut logits, fed).map(Some);
    }
    let key = replay_graph(pool, model, batch, (&p, fed), bucket)?;
    let vocab = model.config().vocab_size;
    step_output(model, batch, graph_logits(pool, vocab, &key)?, fed).map(Some)
}

/// A verification step (every sequence the same number of tokens, every row's logits)
/// replayed as a graph: every row's greedy token, and a copy of the rows' final-normed
/// states. `None` when the step cannot replay one (then it runs op by op).
pub(crate) fn replay_rows<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    model: &Model<B>,
    batch: &ForwardBatch,
    prep: &Prepared,
    choices: RowChoices,
) -> Result<Option<GreedyRows<B>>> {
    if pool.storage().graph_mode != DecodeGraphs::Replay || !eligible(pool, model, batch, true) {
        return Ok(None);
    }
    let b = model.backend();
    let (n, q) = (batch.seqs.len(), batch.seqs[0].tokens.len());
    let h = model.config().hidden_size;
    let bucket = bucket_for(n);
    let p = padded_with_slots(pool, model, (batch, prep), bucket)?;
    let key = replay_graph(pool, model, batch, (&p, None), bucket)?;
    let logits = graph_logits(pool, model.config().vocab_size, &key)?;
    let (tokens, logprobs) = pick_rows(model, logits, &vec![q; n], &batch.adjust, choices)?;
    let rows = n * q;
    let kept = pool.storage().graphs[&key]
        .hidden
        .as_ref()
        .expect("a verification graph keeps its rows");
    // The graph's buffer is rewritten by its next replay.
    let mut hidden = b.scratch(rows * h, b.activation_dtype())?;
    copy_prefix(b, kept, &mut hidden, rows * h)?;
    Ok(Some(GreedyRows {
        tokens,
        logprobs,
        hidden: Some(hidden),
    }))
}

/// The step's output from the padded `[bucket, vocab]` raw logits: the first `n` rows
/// (softcapped by `download_logits`), or their tokens (greedy or drawn), left on the
/// backend.
fn step_output<B: Backend>(
    model: &Model<B>,
    batch: &ForwardBatch,
    logits: &mut B::Buffer,
    fed: Option<&B::Tokens>,
) -> Result<Launched<B>> {
    let b = model.backend();
    let n = batch.seqs.len();
    let vocab = model.config().vocab_size;
    if all_picked(batch) {
        // Steps of tokens (greedy or drawn) read back one id per sequence from the graph's
        // logits (adjusted there first where the batch asks: the next replay rewrites them).
        return model.start_picks(logits, batch, fed);
    }
    let mut rows = b.zeros(n * vocab, b.activation_dtype())?;
    copy_prefix(b, logits, &mut rows, n * vocab)?;
    if !batch.masked.is_empty() {
        return Ok(Launched::held(Some(rows), vec![1; n], batch));
    }
    Ok(Launched::done(model.download_logits(
        Some(rows),
        &vec![1; n],
        batch,
        fed,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_to_16_then_steps_of_4_to_128_and_16_to_256() {
        let want = [
            (1, 1),
            (2, 2),
            (3, 4),
            (5, 8),
            (16, 16),
            (17, 20),
            (33, 36),
            (64, 64),
            (65, 68),
            (97, 100),
            (100, 100),
            (125, 128),
            (128, 128),
            (129, 144),
            (250, 256),
            (256, 256),
        ];
        for (n, bucket) in want {
            assert_eq!(bucket_for(n), bucket, "{n} sequences");
        }
        assert_eq!(decode_buckets(1), [1]);
        assert_eq!(decode_buckets(5), [1, 2, 4, 8]);
        assert_eq!(decode_buckets(18), [1, 2, 4, 8, 16, 20]);
        let all = decode_buckets(10_000);
        assert_eq!(all.len(), 5 + 28 + 8);
        assert_eq!(all.last(), Some(&MAX_GRAPH_BATCH));
        for n in 1..=MAX_GRAPH_BATCH {
            let b = bucket_for(n);
            assert!(b >= n && b <= MAX_GRAPH_BATCH && b - n < n, "{n} -> {b}");
            assert!(all.contains(&b), "{n} -> {b}, not among the buckets");
            if (17..=128).contains(&n) {
                assert!(b - n < BUCKET_STEP, "{n} -> {b}");
            }
            if n > 128 {
                assert!(b - n < WIDE_BUCKET_STEP, "{n} -> {b}");
            }
        }
    }
}
