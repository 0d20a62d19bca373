//! A round of draft steps as one captured graph (CUDA graphs on the GPU).
//!
//! Every step of a round attends over the same keys (the target's stored positions) from
//! the same position, and each step's token is the next one's input: so the whole round
//! is captured once per (sequences, steps), its inputs (first tokens, positions, the
//! target's hidden rows and the attention tables as pages) rewritten in place before each
//! replay, and each step's tokens read back after it. The assistant's centroid head picks
//! its tokens where the logits are ([`strata_kernels::Backend::clustered_argmax`]), so
//! nothing in a round crosses to the host. Op by op, a round of three steps is about 170
//! launches, each waiting on the host.

use strata_kernels::{Backend, DeviceBuffer};
use strata_kv::KvPool;

use crate::assistant::{draft_batch, Assistant, DraftSeq, StepIo};
use crate::decode_graph::{
    bucket_for, copy_prefix, graph_inputs, grow, padded, padded_batch, MAX_GRAPH_BATCH,
};
use crate::error::Result;
use crate::model::Model;
use crate::paged_kv::{DecodeGraphs, GroupTables, HostPages, PagedStorage};

/// One captured round.
pub(crate) struct DraftGraph<B: Backend> {
    graph: B::Graph,
    /// Each sequence's first token of the round.
    ids: B::Index,
    /// Each sequence's drafting position.
    positions: B::Index,
    /// `[n, backbone]`: the state the first step starts from.
    hidden: B::Buffer,
    /// Step `i`'s tokens.
    outs: Vec<B::Index>,
    full: Option<GroupTables<B>>,
    window: Option<GroupTables<B>>,
    full_capacity: usize,
    window_capacity: usize,
}

/// `steps` draft steps for `seqs` replayed as one graph, capturing it first when needed:
/// per step, each sequence's token. A count between buckets replays the next bucket's
/// graph, padded with one-token rows at position 0 on the spare slot (their drafts are
/// dropped). `None` when the round cannot be a graph (graphs off,
/// host-resident tables, a drafter without a centroid head, more sequences than a graph
/// takes); then the caller runs it op by op.
pub(crate) fn draft_round<B: Backend>(
    pool: &mut KvPool<PagedStorage<B>>,
    assistant: &Assistant<B>,
    target: &Model<B>,
    seqs: &[DraftSeq],
    tokens: &[u32],
    hidden: &B::Buffer,
    steps: usize,
) -> Result<Option<Vec<Vec<u32>>>> {
    let b = target.backend();
    let n = seqs.len();
    let eligible = pool.storage().graph_mode == DecodeGraphs::Replay
        && b.supports_graphs()
        && !target.has_host_tables()
        && assistant.picks_on_device()
        && (1..=MAX_GRAPH_BATCH).contains(&n)
        && steps > 0;
    if !eligible {
        return Ok(None);
    }
    let bucket = bucket_for(n);
    let batch = draft_batch(seqs, tokens);
    let prep = target.prepare(&batch)?;
    let p = padded(pool, &batch, &prep, bucket)?;
    let keys = |t: &Option<HostPages>| t.as_ref().map_or(0, |t| t.keys);
    let (need_full, need_window) = (keys(&p.full), keys(&p.window));
    let key = (bucket, steps);
    // The pads' first tokens (0) and positions (0), after the sequences'.
    let mut first = tokens.to_vec();
    first.resize(bucket, 0);
    let mut positions: Vec<u32> = seqs.iter().map(|s| s.position as u32).collect();
    positions.resize(bucket, 0);
    let fits = pool
        .storage()
        .draft_graphs
        .get(&key)
        .is_some_and(|g| need_full <= g.full_capacity && need_window <= g.window_capacity);
    if !fits {
        let old = pool.storage_mut().draft_graphs.remove(&key);
        let full_cap = grow(need_full, old.as_ref().map(|g| g.full_capacity));
        let window_cap = grow(need_window, old.as_ref().map(|g| g.window_capacity));
        drop(old);
        // The graph's own tables, set on the pool for the ops to read.
        let inputs = graph_inputs(pool, b, (&p, None), full_cap, window_cap)?;
        let positions = b.upload_index(&positions)?;
        // Replays rewrite the sequences' rows only: a pad's row is zero or an earlier
        // replay's, and its drafts (rows are independent) are dropped.
        let rows = bucket * assistant.config().backbone_hidden_size;
        let mut start = b.zeros(rows, b.activation_dtype())?;
        copy_prefix(b, hidden, &mut start, hidden.len())?;
        let mut outs = (0..steps)
            .map(|_| b.upload_index(&vec![0; bucket]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let run_batch = padded_batch(&batch, bucket);
        let mut round = |outs: &mut [B::Index]| -> Result<()> {
            let mut state: Option<B::Buffer> = None;
            for i in 0..steps {
                let (done, rest) = outs.split_at_mut(i);
                let ids = done.last().unwrap_or(&inputs.ids);
                let io = StepIo {
                    ids,
                    tokens: &first,
                    positions: &positions,
                    hidden: state.as_ref().unwrap_or(&start),
                };
                let (next, _) = assistant.step_ops(target, pool, &run_batch, io, &mut rest[0])?;
                state = Some(next);
            }
            Ok(())
        };
        // A pass op by op first settles library workspaces, as a decode capture does.
        round(&mut outs)?;
        b.begin_capture()?;
        let recorded = round(&mut outs);
        let graph = b.end_capture();
        recorded?;
        let st = pool.storage_mut();
        let g = DraftGraph {
            graph: graph?,
            ids: inputs.ids,
            positions,
            hidden: start,
            outs,
            full: st.full.take(),
            window: st.window.take(),
            full_capacity: full_cap,
            window_capacity: window_cap,
        };
        st.draft_graphs.insert(key, g);
    }
    let page_size = pool.plan().page_size;
    let g = pool
        .storage_mut()
        .draft_graphs
        .get_mut(&key)
        .expect("captured above");
    b.write_index(&mut g.ids, &first)?;
    b.write_index(&mut g.positions, &positions)?;
    copy_prefix(b, hidden, &mut g.hidden, hidden.len())?;
    for (tables, host) in [(&mut g.full, &p.full), (&mut g.window, &p.window)] {
        if let (Some(t), Some(h)) = (tables.as_mut(), host.as_ref()) {
            b.write_index(&mut t.store, &h.store)?;
            b.paged_batch_update_pages(&mut t.batch, &h.seqs, &h.pages, &h.page_start, page_size)?;
        }
    }
    b.launch_graph(&g.graph)?;
    let drafted = g
        .outs
        .iter()
        .map(|o| {
            let mut d = b.download_index(o)?;
            d.truncate(n);
            Ok(d)
        })
        .collect::<std::result::Result<Vec<_>, strata_kernels::KernelError>>()?;
    Ok(Some(drafted))
}
