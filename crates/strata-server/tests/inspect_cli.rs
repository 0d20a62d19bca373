//! `strata inspect` through the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .unwrap()
}

fn inspect_json(model: &Path) -> Value {
    let out = strata(&["inspect", "--model", model.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim().lines().count(),
        1,
        "exactly one JSON object: {text}"
    );
    serde_json::from_str(&text).unwrap()
}

#[test]
fn e2b_json_report() {
    let v = inspect_json(&repo().join("examples/configs/gemma-4-e2b.json"));
    assert_eq!(v["architecture"], "gemma4");
    assert_eq!(v["num_layers"], 35);
    let types = v["layer_types"].as_array().unwrap();
    assert_eq!(types.len(), 35);
    assert_eq!(types[4], "full_attention");
    assert_eq!(types[0], "sliding_attention");
    let shared = v["kv_shared_layers"].as_array().unwrap();
    assert_eq!(shared.len(), 20);
    assert_eq!(shared[0], serde_json::json!([15, 13]));
    assert_eq!(shared[4], serde_json::json!([19, 14]));
    let groups = v["kv_groups"].as_array().unwrap();
    assert_eq!(groups[0]["attention"], "full");
    assert_eq!(groups[0]["window"], Value::Null);
    assert_eq!(groups[0]["layer_ids"], serde_json::json!([4, 9, 14]));
    assert_eq!(
        groups[0]["shared_layers"],
        serde_json::json!([19, 24, 29, 34])
    );
    assert_eq!(groups[1]["attention"], "sliding");
    assert_eq!(groups[1]["window"], 512);
}

#[test]
fn e4b_from_a_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo().join("examples/configs/gemma-4-e4b.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let v = inspect_json(dir.path());
    assert_eq!(v["num_layers"], 42);
    assert_eq!(
        v["kv_groups"][0]["layer_ids"],
        serde_json::json!([5, 11, 17, 23])
    );
    assert_eq!(v["kv_shared_layers"][0], serde_json::json!([24, 22]));
}

#[test]
fn gguf_file() {
    let mut w = strata_gguf::writer::GgufWriter::new();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 2)
        .u32("llama.embedding_length", 64)
        .u32("llama.feed_forward_length", 128)
        .u32("llama.attention.head_count", 4)
        .u32("llama.vocab_size", 100);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    let v = inspect_json(&path);
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["kv_groups"].as_array().unwrap().len(), 1);
    assert_eq!(v["kv_shared_layers"], serde_json::json!([]));
}

#[test]
fn human_output_lists_groups() {
    let path = repo().join("examples/configs/gemma-4-e2b.json");
    let out = strata(&["inspect", "--model", path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("kv group full"), "{text}");
    assert!(text.contains("15<-13"), "{text}");
}

#[test]
fn unservable_config_exits_nonzero_with_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("examples/configs/gemma-4-e2b.json")).unwrap(),
    )
    .unwrap();
    cfg["text_config"]["enable_moe_block"] = true.into();
    let path = dir.path().join("config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let out = strata(&["inspect", "--model", path.to_str().unwrap(), "--json"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("text_config.enable_moe_block"), "{err}");

    let missing = strata(&["inspect", "--model", "/nonexistent/config.json"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent"));

    let garbage = dir.path().join("bad.gguf");
    std::fs::write(&garbage, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = strata(&["inspect", "--model", garbage.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("error"));
}

fn inspect_args(args: &[&str]) -> Value {
    let out = strata(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn kv_prices_and_pages_for_every_format() {
    let e2b = repo().join("examples/configs/gemma-4-e2b.json");
    let e4b = repo().join("examples/configs/gemma-4-e4b.json");
    let cases = [
        (&e2b, "bf16", 6144, 12288),
        (&e4b, "bf16", 16384, 40960),
        (&e2b, "int8_per_token_head", 3096, 6240),
        (&e2b, "fp8_per_token_head", 3096, 6240),
        (&e4b, "int8_per_token_head", 8256, 20800),
    ];
    for (model, dtype, full, window) in cases {
        let v = inspect_args(&[
            "inspect",
            "--model",
            model.to_str().unwrap(),
            "--json",
            "--kv-cache-dtype",
            dtype,
        ]);
        assert_eq!(v["kv_cache_dtype"], dtype);
        assert_eq!(v["kv_groups"][0]["unit_bytes"], full, "{dtype}");
        assert_eq!(v["kv_groups"][1]["unit_bytes"], window, "{dtype}");
        assert!(v.get("pages").is_none());
    }
    // auto follows the checkpoint's bf16.
    let v = inspect_args(&["inspect", "--model", e2b.to_str().unwrap(), "--json"]);
    assert_eq!(v["kv_cache_dtype"], "bf16");
    assert_eq!(v["kv_groups"][0]["unit_bytes_unshared"], 14336);

    let gib = (1u64 << 30).to_string();
    let v = inspect_args(&[
        "inspect",
        "--model",
        e2b.to_str().unwrap(),
        "--json",
        "--kv-budget-bytes",
        &gib,
        "--page-size",
        "16",
    ]);
    let (full, window) = (
        v["pages"]["full"].as_u64().unwrap(),
        v["pages"]["window"].as_u64().unwrap(),
    );
    assert_eq!(v["pages"]["page_size"], 16);
    assert!(full * 16 * 6144 + window * 16 * 12288 <= 1 << 30);
    assert!(window > 0 && window < full);
    // The window pool's share of the bytes, and a 512-position window over 16-token pages.
    let share = (window * 16 * 12288) as f64 / (full * 16 * 6144 + window * 16 * 12288) as f64;
    let got = v["pages"]["window_share_of_bytes"].as_f64().unwrap();
    assert!((got - share).abs() < 1e-9, "{got} vs {share}");
    assert_eq!(v["pages"]["window_pages_per_request"], 33);

    let bad = strata(&[
        "inspect",
        "--model",
        e2b.to_str().unwrap(),
        "--kv-cache-dtype",
        "int4",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--kv-cache-dtype"));
}

#[test]
fn tensors_of_a_safetensors_model_and_a_gguf() {
    let v = inspect_args(&[
        "inspect",
        "--model",
        repo()
            .join("tests/fixtures/tiny/llama-tiny")
            .to_str()
            .unwrap(),
        "--json",
    ]);
    assert_eq!(v["tensor_types"]["F32"], v["tensors"]);
    // embed 512x64 + 4 layers x (q 64x64 + k,v 32x64 + o 64x64 + mlp 3x96x64 + 2 norms) + norm + lm_head.
    let per_layer = 64 * 64 * 2 + 32 * 64 * 2 + 3 * 96 * 64 + 2 * 64;
    assert_eq!(v["parameters"], 512 * 64 * 2 + 4 * per_layer + 64);

    let gguf = repo().join("models/gemma-3-270m-q4_k_m.gguf");
    if !gguf.exists() {
        eprintln!("skipping the real GGUF: run scripts/fetch-models.sh");
        return;
    }
    let v = inspect_args(&["inspect", "--model", gguf.to_str().unwrap(), "--json"]);
    assert_eq!(v["tensors"], 236);
    assert_eq!(v["tensor_types"]["Q4_K"], 27);
    assert_eq!(v["tensor_types"]["Q6_K"], 9);
    assert_eq!(v["num_layers"], 18);
}

/// A copy of the tiny Llama with one stored weight turned into NaN; returns the directory
/// (kept alive by the guard) and the poisoned tensor's name.
fn poisoned_llama() -> (tempfile::TempDir, PathBuf, String) {
    let src = repo().join("tests/fixtures/tiny/llama-tiny");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let (name, entry) = header
        .iter()
        .find(|(k, v)| k.ends_with("down_proj.weight") && v["dtype"] != "I64")
        .expect("a down projection");
    let at = 8 + n + entry["data_offsets"][0].as_u64().unwrap() as usize;
    let nan: &[u8] = match entry["dtype"].as_str().unwrap() {
        "F32" => &[0x00, 0x00, 0xc0, 0x7f],
        "BF16" | "F16" => &[0x00, 0x7e],
        other => panic!("unexpected dtype {other}"),
    };
    bytes[at..at + nan.len()].copy_from_slice(nan);
    std::fs::write(&path, bytes).unwrap();
    let model = dir.path().to_path_buf();
    (dir, model, name.clone())
}

/// `--check-weights` refuses a model with a NaN weight, naming the tensor; without it the
/// file loads (which is why the scan exists).
#[test]
fn check_weights_names_a_nan_tensor() {
    let (_guard, model, tensor) = poisoned_llama();
    let model = model.to_str().unwrap();
    let out = strata(&["inspect", "--model", model]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        vec!["inspect", "--model", model, "--check-weights"],
        vec![
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
            "--check-weights",
        ],
    ] {
        let out = strata(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} passed:\n{err}");
        assert!(
            err.contains(&tensor) && err.contains("NaN"),
            "{args:?}:\n{err}"
        );
    }
    let clean = repo().join("tests/fixtures/tiny/llama-tiny");
    let out = strata(&[
        "inspect",
        "--model",
        clean.to_str().unwrap(),
        "--check-weights",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("finite"));
}

/// A configuration claiming a million layers is laid out in linear time: `inspect` answers
/// (this once never finished; the bound below only guards against that, it measures
/// nothing).
#[test]
fn a_million_layers_are_inspected_without_hanging() {
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("examples/configs/gemma-4-e2b.json")).unwrap(),
    )
    .unwrap();
    let n = 1_000_000;
    let text = &mut config["text_config"];
    text["num_hidden_layers"] = n.into();
    text["layer_types"] = (0..n)
        .map(|i| {
            if i % 5 == 4 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["inspect", "--json", "--model", path.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("inspect of {n} layers did not finish in 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success());
}

/// `--model org/name` finds the model in a Hugging Face cache laid out as `huggingface_hub`
/// writes it (refs/main naming the snapshot), by branch or by commit; a repo the cache lacks
/// is an error naming the repo id and where it looked (offline: nothing is downloaded).
#[test]
fn a_repo_id_is_found_in_the_hugging_face_cache() {
    let cache = tempfile::tempdir().unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.path().join("models--acme--tiny-llama");
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let src = repo_root_fixture("llama-tiny");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), snapshot.join(f)).unwrap();
    }
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap()
    };
    for extra in [&[][..], &["--revision", "main"], &["--revision", commit]] {
        let mut args = vec!["inspect", "--json", "--model", "acme/tiny-llama"];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["architecture"], "llama");
    }
    let out = run(&["inspect", "--model", "acme/absent"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("acme/absent") && err.contains("models--acme--absent"),
        "{err}"
    );
    let out = run(&["inspect", "--model", "acme/tiny-llama", "--revision", "v9"]);
    assert!(!out.status.success());
}

fn repo_root_fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/tiny").join(name)
}

/// A Gemma-4 GGUF that llama.cpp's converter and `llama-quantize` wrote describes the same
/// model as the checkpoint it came from: every layout field of `inspect` agrees (the KV
/// dtype and the tensor list follow the weights' dtype, so they may differ).
#[test]
fn gemma4_ggufs_of_llama_cpp_report_the_layout_of_their_checkpoint() {
    let dir = repo().join("tests/fixtures/gguf-gemma4");
    let hf = inspect_json(&dir.join("hf"));
    let layout = |v: &Value| {
        let mut groups = v["kv_groups"].clone();
        for g in groups.as_array_mut().unwrap() {
            let g = g.as_object_mut().unwrap();
            g.remove("unit_bytes");
            g.remove("unit_bytes_unshared");
        }
        serde_json::json!({
            "fields": [
                &v["architecture"], &v["num_layers"], &v["hidden_size"], &v["vocab_size"],
                &v["num_attention_heads"], &v["layer_types"], &v["head_dims"],
                &v["num_kv_heads"], &v["intermediate_sizes"], &v["kv_shared_layers"],
            ],
            "groups": groups,
        })
    };
    assert_eq!(hf["kv_shared_layers"].as_array().unwrap().len(), 3);
    for q in ["BF16", "Q8_0", "Q6_K", "Q4_K_M"] {
        let gguf = inspect_json(&dir.join(format!("gemma4-tiny-{q}.gguf")));
        assert_eq!(layout(&gguf), layout(&hf), "{q}");
    }
}
