use super::*;

fn map(arch: &str, shared: Option<usize>) -> NameMap {
    NameMap::new(arch, shared).unwrap()
}

#[test]
fn gemma4_accepts_both_prefixes_and_ignores_towers() {
    let m = map("gemma4", Some(20));
    for prefix in ["model.", "model.language_model.", ""] {
        assert_eq!(
            m.to_gguf(&format!("{prefix}layers.3.self_attn.q_proj.weight"))
                .as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            m.to_gguf(&format!("{prefix}embed_tokens.weight"))
                .as_deref(),
            Some("token_embd.weight")
        );
    }
    assert_eq!(
        m.to_gguf("model.layers.7.layer_scalar").as_deref(),
        Some("blk.7.layer_output_scale.weight")
    );
    assert_eq!(
        m.to_gguf("model.language_model.embed_tokens_per_layer.weight")
            .as_deref(),
        Some("per_layer_token_embd.weight")
    );
    assert_eq!(
        m.to_gguf("model.layers.2.per_layer_input_gate.weight")
            .as_deref(),
        Some("blk.2.inp_gate.weight")
    );
    for tower in [
        "model.vision_tower.encoder.layers.0.mlp.fc1.weight",
        "model.audio_tower.conv.weight",
        "model.embed_vision.embedding_projection.weight",
        "model.embed_audio.embedding_projection.weight",
    ] {
        assert_eq!(m.to_gguf(tower), None, "{tower}");
        assert_eq!(m.strip_prefix(tower), None, "{tower}");
    }
    assert_eq!(
        m.to_gguf("lm_head.weight").as_deref(),
        Some("output.weight")
    );
    assert_eq!(
        m.to_gguf("model.layers.3.self_attn.rotary_emb.inv_freq"),
        None
    );
}

#[test]
fn gemma4_stale_shared_layer_tensors_are_never_mapped() {
    let m = map("gemma4", Some(15));
    for stale in ["k_proj.weight", "v_proj.weight", "k_norm.weight"] {
        let owning = format!("model.language_model.layers.14.self_attn.{stale}");
        let shared = format!("model.language_model.layers.15.self_attn.{stale}");
        assert!(m.to_gguf(&owning).is_some(), "{owning}");
        assert!(!m.is_stale_shared(&owning));
        assert_eq!(m.to_gguf(&shared), None, "{shared}");
        assert!(m.is_stale_shared(&shared));
    }
    // Shared layers still have their own queries and query norms.
    assert!(m
        .to_gguf("model.layers.30.self_attn.q_proj.weight")
        .is_some());
    assert!(m
        .to_gguf("model.layers.30.self_attn.q_norm.weight")
        .is_some());
    // Without a first shared layer nothing is stale.
    assert!(map("gemma4", None)
        .to_gguf("model.layers.30.self_attn.k_proj.weight")
        .is_some());
    // Other architectures never treat k_proj as stale.
    assert!(map("llama", Some(0))
        .to_gguf("model.layers.3.self_attn.k_proj.weight")
        .is_some());
}

#[test]
fn per_architecture_differences() {
    // Llama and Qwen3: post_attention_layernorm feeds the MLP (ffn_norm).
    assert_eq!(
        gguf_name(
            "llama",
            "model.layers.1.post_attention_layernorm.weight",
            None
        )
        .as_deref(),
        Some("blk.1.ffn_norm.weight")
    );
    assert_eq!(
        gguf_name("qwen3", "model.layers.1.self_attn.k_norm.weight", None).as_deref(),
        Some("blk.1.attn_k_norm.weight")
    );
    assert_eq!(
        gguf_name("llama", "model.layers.1.self_attn.k_norm.weight", None),
        None
    );
    // Gemma: post_attention_layernorm is a real post-norm; pre_feedforward is ffn_norm.
    assert_eq!(
        gguf_name(
            "gemma3",
            "model.layers.1.post_attention_layernorm.weight",
            None
        )
        .as_deref(),
        Some("blk.1.post_attention_norm.weight")
    );
    assert_eq!(
        gguf_name(
            "gemma3_text",
            "language_model.model.layers.0.pre_feedforward_layernorm.weight",
            None
        )
        .as_deref(),
        Some("blk.0.ffn_norm.weight")
    );
    // Prefix stripping is per architecture: llama has no multimodal wrapper.
    assert_eq!(
        gguf_name(
            "llama",
            "model.language_model.layers.0.mlp.up_proj.weight",
            None
        ),
        None
    );
    assert_eq!(gguf_name("mamba", "model.norm.weight", None), None);
    assert!(NameMap::new("mamba", None).is_err());
}

#[test]
fn reverse_mapping_round_trips_every_table_entry() {
    for arch in [Arch::Gemma4, Arch::Gemma3, Arch::Llama, Arch::Qwen3] {
        let m = NameMap::for_arch(arch, None);
        let (globals, layer) = arch.tables();
        let mut all: Vec<String> = entries(globals).map(|(_, g)| g.to_string()).collect();
        all.extend(entries(layer).map(|(_, g)| format!("blk.12.{g}")));
        all.push("output.weight".into());
        for g in all {
            let hf = m
                .to_hf(&g)
                .unwrap_or_else(|| panic!("{arch:?}: {g} has no HF name"));
            assert_eq!(
                m.to_gguf(&hf).as_deref(),
                Some(g.as_str()),
                "{arch:?}: {hf}"
            );
        }
        assert_eq!(m.to_hf("rope_freqs.weight"), None);
        assert_eq!(m.to_hf("blk.x.attn_q.weight"), None);
        assert_eq!(m.to_hf("blk.01.attn_q.weight"), None);
    }
    assert_eq!(
        hf_name("gemma4", "blk.4.attn_q.weight").as_deref(),
        Some("model.layers.4.self_attn.q_proj.weight")
    );
}

#[test]
fn gemma3_gguf_norms_carry_the_plus_one() {
    let g3 = map("gemma3", None);
    for n in [
        "output_norm.weight",
        "blk.0.attn_norm.weight",
        "blk.0.attn_q_norm.weight",
        "blk.0.post_ffw_norm.weight",
    ] {
        assert_eq!(g3.gguf_norm_offset(n), 1.0, "{n}");
    }
    assert_eq!(g3.gguf_norm_offset("blk.0.attn_q.weight"), 0.0);
    assert_eq!(
        map("gemma4", None).gguf_norm_offset("output_norm.weight"),
        0.0
    );
    assert_eq!(
        map("llama", None).gguf_norm_offset("output_norm.weight"),
        0.0
    );
}
