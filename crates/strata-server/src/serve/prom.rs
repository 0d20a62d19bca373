//! `/metrics` in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use strata_engine::Engine;

fn series(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

pub fn render(engine: &Engine) -> String {
    let m = &engine.metrics;
    let s = engine.status();
    let mut out = String::new();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    let finished: Vec<(String, f64)> = strata_engine::FINISH_REASONS
        .iter()
        .zip(&m.requests_finished)
        .map(|(r, c)| (format!("{{reason=\"{r}\"}}"), load(c)))
        .collect();
    series(
        &mut out,
        "strata_requests_finished_total",
        "counter",
        "Requests finished, by reason.",
        &finished,
    );
    series(
        &mut out,
        "strata_requests_rejected_total",
        "counter",
        "Requests refused with a 4xx before reaching the engine.",
        &[(String::new(), load(&m.requests_rejected))],
    );
    series(
        &mut out,
        "strata_requests_queue_full_total",
        "counter",
        "Requests refused with 429 because the waiting queue was full (--max-waiting-requests).",
        &[(String::new(), load(&m.requests_queue_full))],
    );
    series(
        &mut out,
        "strata_prompt_tokens_total",
        "counter",
        "Prompt tokens of finished requests.",
        &[(String::new(), load(&m.prompt_tokens))],
    );
    series(
        &mut out,
        "strata_generation_tokens_total",
        "counter",
        "Tokens generated.",
        &[(String::new(), load(&m.generation_tokens))],
    );
    series(
        &mut out,
        "strata_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        &[(String::new(), load(&m.cached_tokens))],
    );
    series(
        &mut out,
        "strata_requests_running",
        "gauge",
        "Requests holding KV pages.",
        &[(String::new(), s.running as f64)],
    );
    series(
        &mut out,
        "strata_requests_waiting",
        "gauge",
        "Requests queued.",
        &[(String::new(), s.waiting as f64)],
    );
    series(
        &mut out,
        "strata_preemptions_total",
        "counter",
        "Requests preempted when pages ran out.",
        &[(String::new(), s.preemptions as f64)],
    );
    series(
        &mut out,
        "strata_structured_masks_total",
        "counter",
        "Grammar masks computed on the host (response_format, guided_*, forced tool calls).",
        &[(String::new(), s.masks.masks as f64)],
    );
    series(
        &mut out,
        "strata_structured_mask_seconds_total",
        "counter",
        "Host seconds spent computing and applying those masks.",
        &[(String::new(), s.masks.seconds)],
    );
    if let Some(media) = engine.media.as_deref().filter(|e| e.takes_images()) {
        let (passes, images) = media.image_passes();
        series(
            &mut out,
            "strata_image_passes_total",
            "counter",
            "Vision tower passes (one can carry several requests' images).",
            &[(String::new(), passes as f64)],
        );
        series(
            &mut out,
            "strata_image_pass_images_total",
            "counter",
            "Images those passes took.",
            &[(String::new(), images as f64)],
        );
    }
    series(
        &mut out,
        "strata_overlapped_steps_total",
        "counter",
        "Decode steps queued before the step ahead of them was read (--overlap).",
        &[(String::new(), s.overlapped_steps as f64)],
    );
    for (name, help, value) in [
        (
            "strata_spec_rounds_total",
            "Speculative rounds: target steps that checked drafts (--draft).",
            s.drafts.rounds,
        ),
        (
            "strata_spec_draft_tokens_total",
            "Tokens drafted by the draft model.",
            s.drafts.drafted,
        ),
        (
            "strata_spec_accepted_tokens_total",
            "Drafted tokens the model agreed with (kept).",
            s.drafts.accepted,
        ),
    ] {
        series(
            &mut out,
            name,
            "counter",
            help,
            &[(String::new(), value as f64)],
        );
    }
    for (name, kind, help, value) in [
        (
            "strata_lora_adapters_loaded",
            "gauge",
            "LoRA adapters loaded (in host memory).",
            s.loras.loaded as f64,
        ),
        (
            "strata_lora_adapters_resident",
            "gauge",
            "LoRA adapters on the device (at most --max-loras).",
            s.loras.resident as f64,
        ),
        (
            "strata_lora_uploads_total",
            "counter",
            "LoRA adapters uploaded to the device (first uses and swaps back in).",
            s.loras.uploads as f64,
        ),
    ] {
        series(&mut out, name, kind, help, &[(String::new(), value)]);
    }
    if let Some(kv) = &s.kv {
        for (name, help, f) in [
            (
                "strata_kv_pages_total",
                "KV pages per pool.",
                (|p: &strata_kv::PoolStatus| p.pages_total) as fn(&strata_kv::PoolStatus) -> usize,
            ),
            (
                "strata_kv_pages_used",
                "KV pages in use per pool (prefix cache included).",
                |p| p.pages_used,
            ),
            ("strata_kv_pages_free", "Free KV pages per pool.", |p| {
                p.pages_free
            }),
            (
                "strata_kv_pages_cached",
                "KV pages held by the prefix cache per pool.",
                |p| p.pages_cached,
            ),
            (
                "strata_kv_pages_evictable",
                "KV pages the pool can take back on demand per pool (window: idle pages).",
                |p| p.pages_evictable,
            ),
        ] {
            let samples: Vec<(String, f64)> = kv
                .pools
                .iter()
                .map(|p| (format!("{{pool=\"{}\"}}", p.pool.name()), f(p) as f64))
                .collect();
            series(&mut out, name, "gauge", help, &samples);
        }
        series(
            &mut out,
            "strata_prefix_cache_hits_total",
            "counter",
            "Prefix-cache lookups that reused pages.",
            &[(String::new(), kv.cache_hits as f64)],
        );
        series(
            &mut out,
            "strata_prefix_cache_misses_total",
            "counter",
            "Prefix-cache lookups that reused nothing.",
            &[(String::new(), kv.cache_misses as f64)],
        );
        series(
            &mut out,
            "strata_prefix_cache_tokens",
            "gauge",
            "Tokens held by the prefix cache.",
            &[(String::new(), kv.cached_tokens as f64)],
        );
        series(
            &mut out,
            "strata_kv_window_pages_past_window",
            "gauge",
            "Window pages kept after their positions left a running request's window.",
            &[(String::new(), kv.window_pages_past_window as f64)],
        );
        for (name, help, value) in [
            (
                "strata_prefix_cache_window_hits_total",
                "Prefix-cache hits that read window pages kept past a request's window.",
                kv.window_hits,
            ),
            (
                "strata_prefix_cache_window_hit_tokens_total",
                "Prompt tokens served by those hits.",
                kv.window_hit_tokens,
            ),
            (
                "strata_kv_window_pages_evicted_total",
                "Idle window pages evicted to make room.",
                kv.window_pages_evicted,
            ),
        ] {
            series(
                &mut out,
                name,
                "counter",
                help,
                &[(String::new(), value as f64)],
            );
        }
    }
    m.ttft.render(
        "strata_time_to_first_token_seconds",
        "Time from submission to the first token.",
        &mut out,
    );
    m.inter_token.render(
        "strata_inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
        &mut out,
    );
    m.step.render(
        "strata_engine_step_seconds",
        "One engine step: batch assembly, the forward pass, sampling.",
        &mut out,
    );
    m.step_gap.render(
        "strata_engine_step_gap_seconds",
        "Engine-thread time between consecutive steps while requests run.",
        &mut out,
    );
    out
}
