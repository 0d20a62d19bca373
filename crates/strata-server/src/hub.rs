//! `--model org/name`: a Hugging Face repo id, found in the local Hugging Face cache
//! (`models--org--name/snapshots/<commit>/`, as `huggingface_hub` lays it out) and, where the
//! machine has network, downloaded into it through `hf-hub`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use hf_hub::{Cache, Repo, RepoType};

/// The files of a model repository worth fetching: configuration, tokenizer, template and
/// weights (safetensors, or a single GGUF when there are no safetensors).
fn wanted(name: &str) -> bool {
    const EXACT: [&str; 7] = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "model.safetensors.index.json",
    ];
    !name.contains('/') && (EXACT.contains(&name) || name.ends_with(".safetensors"))
}

/// Whether `arg` names a repo (`org/name`) rather than a path.
pub fn is_repo_id(arg: &str) -> bool {
    let mut parts = arg.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The hub cache as `huggingface_hub` finds it: `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
/// `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, then `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    let var = |n: &str| {
        std::env::var_os(n)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return p;
    }
    if let Some(home) = var("HF_HOME") {
        return home.join("hub");
    }
    let base = var("XDG_CACHE_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("huggingface").join("hub")
}

/// `HF_HUB_OFFLINE` set to 1, on, yes or true: never reach the network.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.to_ascii_uppercase().as_str()))
}

/// The snapshot directory of `id` at `revision` (a branch, tag or commit) in `cache`, if
/// the cache holds one with a model in it.
fn cached_snapshot(cache: &Path, id: &str, revision: &str) -> Option<PathBuf> {
    let repo = Repo::with_revision(id.to_string(), RepoType::Model, revision.to_string());
    let dir = cache.join(repo.folder_name());
    let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
    let commit = if is_commit {
        revision.to_string()
    } else {
        std::fs::read_to_string(dir.join("refs").join(revision))
            .ok()?
            .trim()
            .to_string()
    };
    let snapshot = dir.join("snapshots").join(commit);
    let has_model = snapshot.join("config.json").is_file()
        || std::fs::read_dir(&snapshot)
            .ok()?
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "gguf"));
    has_model.then_some(snapshot)
}

/// Where `--model` points: a path as given, or a repo id's snapshot (from the cache, else
/// downloaded). `revision` applies to repo ids only.
pub fn resolve(model: &Path, revision: Option<&str>) -> anyhow::Result<PathBuf> {
    let arg = model.to_string_lossy();
    if model.exists() || !is_repo_id(&arg) {
        if revision.is_some() {
            bail!("--revision applies to a Hugging Face repo id; {arg} is a path");
        }
        return Ok(model.to_path_buf());
    }
    let revision = revision.unwrap_or("main");
    let cache = cache_dir();
    if let Some(snapshot) = cached_snapshot(&cache, &arg, revision) {
        return Ok(snapshot);
    }
    let looked = cache
        .join(Repo::model(arg.to_string()).folder_name())
        .join("snapshots");
    if offline() {
        bail!(
            "{arg} (revision {revision}) is not in the Hugging Face cache (looked in {}); HF_HUB_OFFLINE is set, so it was not downloaded",
            looked.display()
        );
    }
    download(&cache, &arg, revision).with_context(|| {
        format!(
            "{arg} (revision {revision}) is not in the Hugging Face cache (looked in {}) and could not be downloaded",
            looked.display()
        )
    })
}

/// Fetches the model's files into the cache; returns the snapshot directory.
fn download(cache: &Path, id: &str, revision: &str) -> anyhow::Result<PathBuf> {
    use std::io::IsTerminal;
    let api = hf_hub::api::sync::ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
        // A bar per file on a terminal; plain log lines otherwise.
        .with_progress(std::io::stderr().is_terminal())
        .build()?;
    let repo = api.repo(Repo::with_revision(
        id.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let names: Vec<String> = repo
        .info()?
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .collect();
    let mut files: Vec<&String> = names.iter().filter(|n| wanted(n)).collect();
    if !files.iter().any(|n| n.ends_with(".safetensors")) {
        let ggufs: Vec<&String> = names.iter().filter(|n| n.ends_with(".gguf")).collect();
        match ggufs.as_slice() {
            [one] => files.push(one),
            [] => bail!("the repo holds neither safetensors nor a GGUF file"),
            many => bail!(
                "the repo holds {} GGUF files; download the one to serve and pass its path",
                many.len()
            ),
        }
    }
    let mut snapshot = None;
    for name in files {
        eprintln!("[strata] fetching {id}/{name}");
        let path = repo.get(name)?;
        snapshot = path.parent().map(Path::to_path_buf);
    }
    snapshot.context("the repo lists no files")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_paths_are_told_apart() {
        for id in ["google/gemma-3-270m", "org/name.v2", "a_b/c-d"] {
            assert!(is_repo_id(id), "{id}");
        }
        for path in [
            "model.gguf",
            "./org/name",
            "/abs/path",
            "a/b/c",
            "../x",
            "org/",
            "org/na me",
        ] {
            assert!(!is_repo_id(path), "{path}");
        }
    }
}
