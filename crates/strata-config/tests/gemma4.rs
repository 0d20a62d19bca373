//! Gemma-4 configurations (E2B, E4B) in the forms Google ships and transformers re-saves,
//! and the shapes the parser refuses.

mod common;

use strata_config::{AttentionType, ModelConfig, RopeKind};

fn parse(v: &serde_json::Value) -> ModelConfig {
    ModelConfig::from_hf_json(&v.to_string()).unwrap()
}

fn check_e2b(c: &ModelConfig) {
    assert_eq!(c.num_layers(), 35);
    let shared = c.kv_shared_layers();
    assert_eq!(shared.len(), 20);
    for (l, s) in &shared {
        let expect = if l % 5 == 4 { 14 } else { 13 };
        assert_eq!(*s, expect, "layer {l}");
    }
    for (i, l) in c.layers.iter().enumerate() {
        let full = i % 5 == 4;
        assert_eq!(
            l.attention,
            if full {
                AttentionType::Full
            } else {
                AttentionType::Sliding
            }
        );
        assert_eq!(l.head_dim, if full { 512 } else { 256 });
        assert_eq!(l.num_kv_heads, 1);
        assert_eq!(
            l.intermediate_size,
            if i >= 15 { 12288 } else { 6144 },
            "layer {i}"
        );
        assert_eq!(l.window, if full { None } else { Some(512) });
        if full {
            assert_eq!(l.rope.kind, RopeKind::Proportional);
            assert_eq!(l.rope.partial_rotary_factor, 0.25);
            assert_eq!(l.rope.theta, 1e6);
        } else {
            assert_eq!(l.rope.kind, RopeKind::Default);
            assert_eq!(l.rope.theta, 1e4);
        }
    }
    let groups = c.kv_group_specs();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].attention, AttentionType::Full);
    assert_eq!(groups[0].layer_ids, vec![4, 9, 14]);
    assert_eq!(groups[0].shared_layers, vec![19, 24, 29, 34]);
    assert_eq!(groups[1].window, Some(512));
    assert_eq!(
        groups[1].layer_ids,
        vec![0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]
    );
    assert_eq!(groups[1].shared_layers.len(), 16);
    assert_eq!(c.eos_token_ids, vec![1]);
    assert_eq!(c.per_layer_input.unwrap().hidden_size, 256);
    assert_eq!(c.final_logit_softcapping, Some(30.0));
    assert_eq!(c.attention_scale, 1.0);
}

#[test]
fn e2b_shipped_form() {
    check_e2b(&parse(&common::e2b()));
}

#[test]
fn e2b_resaved_form_with_per_layer_config() {
    check_e2b(&parse(&common::resaved(common::e2b())));
}

#[test]
fn e2b_text_only_form() {
    let text = common::e2b()["text_config"].clone();
    check_e2b(&parse(&text));
    // A text-only checkpoint has no placeholders.
    assert!(parse(&text).placeholder_ids.is_empty());
}

/// transformers' `Gemma4Model` embeds the multimodal placeholders as pad wherever they
/// appear (a generated one too): a multimodal config lists them for the model to do so.
#[test]
fn multimodal_placeholders_are_listed() {
    let mut cfg = common::e2b();
    cfg["audio_token_id"] = 258881.into();
    cfg["video_token_id"] = 258884.into();
    assert_eq!(parse(&cfg).placeholder_ids, [258880, 258881, 258884]);
    // Ids past the vocabulary cannot be fed, so they are not listed.
    cfg["video_token_id"] = 300000.into();
    assert_eq!(parse(&cfg).placeholder_ids, [258880, 258881]);
}

fn check_e4b(c: &ModelConfig) {
    assert_eq!(c.num_layers(), 42);
    let shared = c.kv_shared_layers();
    assert_eq!(shared.len(), 18);
    assert_eq!(shared[0], (24, 22));
    assert!(shared.contains(&(29, 23)));
    assert!(shared.contains(&(41, 23)));
    assert!(c
        .layers
        .iter()
        .all(|l| l.intermediate_size == 10240 && l.num_kv_heads == 2));
    let g = c.kv_group_specs();
    assert_eq!(g[0].layer_ids, vec![5, 11, 17, 23]);
    assert_eq!(g[0].shared_layers, vec![29, 35, 41]);
    assert_eq!(g[1].layer_ids.len(), 20);
    assert_eq!(g[1].shared_layers.len(), 15);
    assert_eq!(g[0].kv_shapes[0].head_dim, 512);
    assert_eq!(g[1].kv_shapes[0].num_kv_heads, 2);
}

#[test]
fn e4b_both_forms() {
    check_e4b(&parse(&common::e4b()));
    check_e4b(&parse(&common::resaved(common::e4b())));
}

#[test]
fn eos_from_wrapper_when_text_config_has_none() {
    let mut v = common::e2b();
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("eos_token_id");
    assert_eq!(parse(&v).eos_token_ids, vec![1, 106]);
}

#[test]
fn default_layer_pattern_forces_last_layer_full() {
    let mut v = common::e4b()["text_config"].clone();
    let o = v.as_object_mut().unwrap();
    o.remove("layer_types");
    o.insert("num_hidden_layers".into(), 8.into());
    o.insert("num_kv_shared_layers".into(), 0.into());
    let c = parse(&v);
    let full: Vec<usize> = (0..8)
        .filter(|&i| c.layers[i].attention == AttentionType::Full)
        .collect();
    assert_eq!(full, vec![5, 7]);
}

fn refusal(mutate: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let mut v = common::e2b();
    mutate(v["text_config"].as_object_mut().unwrap());
    ModelConfig::from_hf_json(&v.to_string())
        .unwrap_err()
        .to_string()
}

#[test]
fn unservable_shapes_are_refused_naming_the_field() {
    let e = refusal(|o| {
        o.insert("enable_moe_block".into(), true.into());
    });
    assert!(e.contains("text_config.enable_moe_block"), "{e}");
    let e = refusal(|o| {
        o.insert("attention_k_eq_v".into(), true.into());
    });
    assert!(e.contains("attention_k_eq_v"), "{e}");
    let e = refusal(|o| {
        o.insert("hidden_activation".into(), "relu".into());
    });
    assert!(e.contains("hidden_activation"), "{e}");
    let e = refusal(|o| {
        o.insert("use_bidirectional_attention".into(), "all".into());
    });
    assert!(e.contains("use_bidirectional_attention"), "{e}");
    let e = refusal(|o| {
        o["rope_parameters"]["full_attention"]["rope_type"] = "yarn".into();
    });
    assert!(
        e.contains("rope_parameters.full_attention.rope_type"),
        "{e}"
    );
    let e = refusal(|o| {
        o.insert(
            "layer_types".into(),
            serde_json::json!(["sliding_attention"]),
        );
    });
    assert!(e.contains("layer_types"), "{e}");
}

#[test]
fn shared_group_without_source_is_refused() {
    // Layers 0-1 own KV and are both sliding; the shared full layer 2 has no source.
    let e = refusal(|o| {
        o.insert("num_hidden_layers".into(), 4.into());
        o.insert(
            "layer_types".into(),
            serde_json::json!([
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "full_attention"
            ]),
        );
        o.insert("num_kv_shared_layers".into(), 2.into());
    });
    assert!(
        e.contains("num_kv_shared_layers") && e.contains("layer 2"),
        "{e}"
    );
}

/// Zero sizes and non-positive values in a `config.json` are refused, naming the field.
#[test]
fn nonsense_values_are_refused_naming_the_field() {
    let cases = [
        ("head_dim", serde_json::json!(0), "head_dim"),
        ("rms_norm_eps", serde_json::json!(-1e-6), "rms_norm_eps"),
        ("vocab_size", serde_json::json!(0), "vocab_size"),
        (
            "final_logit_softcapping",
            serde_json::json!(-30.0),
            "final_logit_softcapping",
        ),
        ("hidden_size", serde_json::json!(0), "hidden_size"),
    ];
    for (key, value, field) in cases {
        let mut cfg = common::e2b();
        // The multimodal wrapper carries the text model's fields under `text_config`.
        cfg["text_config"][key] = value.clone();
        let err = ModelConfig::from_hf_json(&cfg.to_string())
            .expect_err(&format!("{key} = {value}"))
            .to_string();
        assert!(err.contains(field), "{key} = {value}: {err}");
    }
}
