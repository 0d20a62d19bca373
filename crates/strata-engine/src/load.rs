//! Loading a model, its tokenizer and its chat template.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use strata_config::{load_model_config, Architecture, ModelConfig, ModelSource};
use strata_gguf::GgufFile;
use strata_kernels::cpu::CpuBackend;
use strata_kernels::DType;
use strata_model::{LoadOptions, Model};
use strata_tokenizer::{
    ChatMessage, ChatOptions, ChatPart, ChatTemplate, Tokenizer, GEMMA_TEMPLATE,
};

use crate::{EngineError, MediaEncoder, Result, Runtime};

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// CUDA when a GPU is present, else the CPU.
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend (fails to load without a GPU or in a build without it).
    Cuda,
}

impl FromStr for Device {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(EngineError::Invalid(format!(
                "unknown device {other:?} (auto, cpu, cuda)"
            ))),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        })
    }
}

/// The dtype dense weights compute in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightDtype {
    /// As stored on the CPU. On CUDA: 16-bit weights as bf16 with bf16 GEMMs (f32
    /// accumulation), f32 checkpoints as f32, GGUF blocks decoded to bf16 at load (kept as
    /// blocks with `--gguf-weights blocks`).
    #[default]
    Auto,
    /// Every dense weight widened to f32 and f32 GEMMs (the reference path).
    F32,
    /// Every dense weight as bf16 (bf16 GEMMs on CUDA).
    Bf16,
}

impl FromStr for WeightDtype {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(WeightDtype::Auto),
            "f32" | "float32" => Ok(WeightDtype::F32),
            "bf16" | "bfloat16" => Ok(WeightDtype::Bf16),
            other => Err(EngineError::Invalid(format!(
                "unknown dtype {other:?} (auto, f32, bf16)"
            ))),
        }
    }
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightDtype::Auto => "auto",
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
        })
    }
}

/// Where and how a model is placed.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadSettings {
    /// Where the model runs.
    pub device: Device,
    /// The dtype dense weights compute in.
    pub dtype: WeightDtype,
    /// `--embed-weights host`: lookup-only embedding tables stay in host memory.
    pub host_embeddings: bool,
    /// `--quantize`: dense matrices quantized to this GGUF block format as they load.
    pub quantize: Option<strata_gguf::GgmlType>,
    /// `--gguf-weights blocks`: a GGUF's block-quantized matrices stay blocks on the GPU.
    pub keep_blocks: bool,
    /// `--text-model-only`: a multimodal checkpoint's encoders are not loaded.
    pub text_model_only: bool,
    /// `--media-device host`: the encoders stay on the host when the model runs on a GPU.
    pub media_on_host: bool,
    /// Report a load that takes more than a second on stderr (a bar on a terminal, plain
    /// lines otherwise).
    pub progress: bool,
}

/// A model ready to run, with its tokenizer.
pub struct LoadedModel {
    /// The model and its drafter, on the device they run on.
    pub runtime: Runtime,
    settings: LoadSettings,
    /// Where the model was loaded from.
    path: std::path::PathBuf,
    /// The model's tokenizer; `None` for a model directory without `tokenizer.json`.
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The model's own stop tokens (config EOS ids and the tokenizer's EOS).
    pub stop_ids: Vec<u32>,
    chat: Option<Arc<ChatTemplate>>,
    /// The checkpoint's vision tower, unless it has none or `text_model_only`.
    pub media: Option<Arc<MediaEncoder>>,
}

/// Text -> prompt ids for one model: its tokenizer and chat template, shareable across threads.
#[derive(Clone)]
pub struct Prompter {
    /// The model's tokenizer, if it has one.
    pub tokenizer: Option<Arc<Tokenizer>>,
    chat: Option<Arc<ChatTemplate>>,
}

impl LoadedModel {
    /// Loads the model at `path` (a model directory, `config.json`'s directory, or a
    /// `.gguf`) on `device`, with default settings otherwise.
    pub fn load(path: &Path, device: Device) -> Result<Self> {
        Self::load_with(
            path,
            LoadSettings {
                device,
                ..Default::default()
            },
        )
    }

    /// Loads the model at `path` with its tokenizer and chat template, placed as `settings`
    /// asks.
    pub fn load_with(path: &Path, settings: LoadSettings) -> Result<Self> {
        let (config, source) = load_model_config(path)?;
        let tokenizer = match &source {
            ModelSource::Gguf(p) => Some(Tokenizer::from_gguf(&GgufFile::open(p)?)?),
            ModelSource::HuggingFace { dir, .. } if dir.join("tokenizer.json").is_file() => {
                Some(Tokenizer::from_hf_dir(dir)?)
            }
            ModelSource::HuggingFace { .. } => None,
        };
        let runtime = place(path, settings)?;
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut media = match &source {
            ModelSource::HuggingFace { dir, .. } if !settings.text_model_only => {
                MediaEncoder::load(dir)?
            }
            _ => None,
        };
        // The towers follow the model onto the GPU (before the KV pool is sized
        // from what memory is left), unless `--media-device host`.
        #[cfg(feature = "cuda")]
        if let Some(m) = media.as_mut() {
            if runtime.on_gpu() && !settings.media_on_host {
                let bf16 = settings.dtype != WeightDtype::F32;
                m.vision_on_gpu(bf16)
                    .and_then(|()| m.audio_on_gpu(bf16))
                    .map_err(|e| {
                        EngineError::Invalid(format!(
                            "{e} (--media-device host keeps the towers on the host)"
                        ))
                    })?;
            }
        }
        let media = media.map(Arc::new);
        let mut stop_ids = config.eos_token_ids.clone();
        if let Some(t) = &tokenizer {
            stop_ids.extend(t.eos_id());
            // Gemma's chat turns end with <end_of_turn> (Gemma-4: <turn|>), which the GGUF
            // does not list as EOS.
            if matches!(
                config.architecture,
                Architecture::Gemma3 | Architecture::Gemma4
            ) {
                stop_ids.extend(t.token_id("<end_of_turn>"));
            }
            if config.architecture == Architecture::Gemma4 {
                stop_ids.extend(t.token_id("<turn|>"));
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let chat = match &tokenizer {
            Some(t) => chat_template(&config, t)?,
            None => None,
        };
        Ok(Self {
            runtime,
            settings,
            path: path.to_path_buf(),
            tokenizer: tokenizer.map(Arc::new),
            stop_ids,
            chat: chat.map(Arc::new),
            media,
        })
    }

    /// Where the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the weights were placed, to load another copy the same way (no progress
    /// report).
    pub(crate) fn load_options(&self) -> strata_model::LoadOptions {
        load_options(LoadSettings {
            progress: false,
            ..self.settings
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        self.runtime.config()
    }

    /// Loads a Gemma-4 assistant (its directory or `config.json`) beside the model, on the
    /// same device and with the same weight dtype, for speculative decoding. A drafter that
    /// does not fit the model is refused, naming the field.
    pub fn load_draft(&mut self, path: &Path) -> Result<()> {
        self.runtime.load_draft(path, load_options(self.settings))
    }

    /// Replaces the model's chat template with `source` (`--chat-template`); refused when
    /// it does not compile or the model has no tokenizer to render with.
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        let tok = self.tokenizer.as_deref().ok_or_else(|| {
            EngineError::Invalid("a chat template needs the model's tokenizer".into())
        })?;
        let (bos, eos) = special_texts(tok);
        self.chat = Some(Arc::new(ChatTemplate::new(source, &bos, &eos)?));
        Ok(())
    }

    /// The tokenizer and chat template, for threads that prepare prompts.
    pub fn prompter(&self) -> Prompter {
        Prompter {
            tokenizer: self.tokenizer.clone(),
            chat: self.chat.clone(),
        }
    }

    /// See [`Prompter::encode_prompt`].
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.prompter().encode_prompt(text)
    }

    /// See [`Prompter::encode_chat`].
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.prompter().encode_chat(messages)
    }

    /// See [`Prompter::decode`].
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.prompter().decode(ids)
    }
}

impl Prompter {
    fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_deref().ok_or_else(|| {
            EngineError::Invalid(
                "this model has no tokenizer (no tokenizer.json); pass token ids".into(),
            )
        })
    }

    /// Whether chat requests can be rendered: the model has a chat template (its own, or
    /// Gemma's turn format for Gemma files that carry none).
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// Token ids of a raw prompt, with BOS added the way the model's tokenizer is configured.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer()?.encode(text, true, true)?)
    }

    /// Token ids of a chat conversation, rendered with the model's chat template.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, &ChatOptions::default())
    }

    /// The model's chat template, when it has one (its source tells which tool-call
    /// format the model speaks).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_deref()
    }

    /// [`Self::encode_chat`] with tools and template variables.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<Vec<u32>> {
        let tok = self.tokenizer()?;
        let (text, literals) = self.render_marked(tok, messages, options)?;
        // The template writes BOS itself when the model wants one.
        let bos_in_text = tok
            .bos_id()
            .and_then(|b| tok.decode(&[b], true).ok())
            .is_some_and(|b| !b.is_empty() && text.starts_with(&b));
        if literals.is_empty() {
            return Ok(tok.encode(&text, !bos_in_text, true)?);
        }
        let marks = Markers::unused_in(messages, options);
        let pieces = marks.split(&text, &literals)?;
        Ok(tok.encode_pieces(&pieces, !bos_in_text)?)
    }

    /// The prompt text the chat template renders for `messages` (the assistant's turn
    /// opened), as [`Self::encode_chat_with`] tokenizes it.
    pub fn render_chat(&self, messages: &[ChatMessage], options: &ChatOptions) -> Result<String> {
        Ok(self.chat()?.render_with(messages, true, options)?)
    }

    fn chat(&self) -> Result<&ChatTemplate> {
        self.chat
            .as_deref()
            .ok_or_else(|| EngineError::Invalid("this model has no chat template".into()))
    }

    /// Renders with each control token's text inside a message (a user writing
    /// `<end_of_turn>`), a tool call's arguments, a tool's description or a template
    /// variable swapped for a marker, so that it stays text: only the template's own markup
    /// yields control tokens. Returns the text and the hidden literals.
    fn render_marked(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<(String, Vec<String>)> {
        let chat = self.chat()?;
        let marks = Markers::unused_in(messages, options);
        let mut literals = Vec::new();
        let marked: Vec<ChatMessage> = messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                m.content = marks.hide(&m.content, &tok.control_spans(&m.content), &mut literals);
                for part in &mut m.parts {
                    if let ChatPart::Text(t) = part {
                        *t = marks.hide(t, &tok.control_spans(t), &mut literals);
                    }
                }
                for call in m.tool_calls.iter_mut().flatten() {
                    marks.hide_json(call, tok, &mut literals);
                }
                m
            })
            .collect();
        let mut options = options.clone();
        for tool in options.tools.iter_mut().flatten() {
            marks.hide_json(tool, tok, &mut literals);
        }
        for value in options.kwargs.values_mut() {
            marks.hide_json(value, tok, &mut literals);
        }
        Ok((chat.render_with(&marked, true, &options)?, literals))
    }

    /// Text of `ids`, special tokens left out; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(self.tokenizer()?.decode(ids, false)?)
    }
}

/// Loads the weights on the device `settings` asks for (auto: CUDA when it starts).
fn place(path: &Path, settings: LoadSettings) -> Result<Runtime> {
    let opts = load_options(settings);
    #[cfg(feature = "cuda")]
    {
        use strata_kernels::cuda::CudaBackend;
        let gpu = match settings.device {
            Device::Cpu => None,
            Device::Cuda => Some(CudaBackend::new(0).map_err(|e| {
                EngineError::Invalid(format!(
                    "--device cuda: the CUDA backend did not start: {e}"
                ))
            })?),
            Device::Auto => CudaBackend::new(0).ok(),
        };
        if let Some(b) = gpu {
            let b = b.with_bf16_gemm(settings.dtype != WeightDtype::F32);
            return Ok(Runtime::cuda(Model::load_with(b, path, opts)?));
        }
    }
    #[cfg(not(feature = "cuda"))]
    if settings.device == Device::Cuda {
        return Err(EngineError::Invalid(
            "--device cuda: this build has no CUDA backend (built without the `cuda` feature)"
                .into(),
        ));
    }
    Ok(Runtime::cpu(Model::load_with(
        CpuBackend::new(),
        path,
        opts,
    )?))
}

/// How `settings` place weights on a backend.
fn load_options(settings: LoadSettings) -> LoadOptions {
    let weight_dtype = match settings.dtype {
        WeightDtype::Auto => None,
        WeightDtype::F32 => Some(DType::F32),
        WeightDtype::Bf16 => Some(DType::BF16),
    };
    LoadOptions {
        weight_dtype,
        host_embeddings: settings.host_embeddings,
        quantize: settings.quantize,
        keep_blocks: settings.keep_blocks,
        progress: settings.progress.then(crate::progress::on_stderr),
    }
}

/// The model's own template, or Gemma's turn format for Gemma files that carry none.
fn chat_template(config: &ModelConfig, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
    let (bos, eos) = special_texts(tok);
    let source = match tok.chat_template() {
        Some(t) => t,
        None if matches!(
            config.architecture,
            Architecture::Gemma3 | Architecture::Gemma4
        ) =>
        {
            GEMMA_TEMPLATE
        }
        None => return Ok(None),
    };
    Ok(Some(ChatTemplate::new(source, &bos, &eos)?))
}

/// The texts of BOS and EOS, which templates print.
fn special_texts(tok: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| {
        id.and_then(|i| tok.decode(&[i], true).ok())
            .unwrap_or_default()
    };
    (text(tok.bos_id()), text(tok.eos_id()))
}

/// Two characters that appear in no message, to mark where a control token's text stood
/// in a message: `open`, the literal's index, `close`.
struct Markers {
    open: char,
    close: char,
}

impl Markers {
    /// The first pair from the private use area that no message contains.
    fn unused_in(messages: &[ChatMessage], options: &ChatOptions) -> Self {
        // Every text the template may print: the messages (with their calls), the tools
        // and the variables.
        let all = serde_json::json!([messages, options.tools, options.kwargs]).to_string();
        let used = |c: char| all.contains(c);
        let mut free = ('\u{E000}'..='\u{F8FF}').filter(|&c| !used(c));
        // A conversation cannot hold all 6,400 of them and stay under the body limit.
        let open = free.next().unwrap_or('\u{E000}');
        let close = free.next().unwrap_or('\u{E001}');
        Self { open, close }
    }

    /// Every string (and object key) in `value` with its control-token texts hidden.
    fn hide_json(
        &self,
        value: &mut serde_json::Value,
        tok: &Tokenizer,
        literals: &mut Vec<String>,
    ) {
        use serde_json::Value;
        match value {
            Value::String(s) => *s = self.hide(s, &tok.control_spans(s), literals),
            Value::Array(items) => {
                for v in items {
                    self.hide_json(v, tok, literals);
                }
            }
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut v) in entries {
                    self.hide_json(&mut v, tok, literals);
                    map.insert(self.hide(&k, &tok.control_spans(&k), literals), v);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// `content` with each of its control-token texts (at `spans`) replaced by a marker;
    /// the texts go to `literals`.
    fn hide(
        &self,
        content: &str,
        spans: &[std::ops::Range<usize>],
        literals: &mut Vec<String>,
    ) -> String {
        let mut out = String::with_capacity(content.len());
        let mut last = 0;
        for span in spans {
            out.push_str(&content[last..span.start]);
            out.push(self.open);
            out.push_str(&literals.len().to_string());
            out.push(self.close);
            literals.push(content[span.clone()].to_string());
            last = span.end;
        }
        out.push_str(&content[last..]);
        out
    }

    /// The rendered text as pieces: markup (`false`) and the hidden literals (`true`).
    fn split<'a>(&self, text: &'a str, literals: &'a [String]) -> Result<Vec<(&'a str, bool)>> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(self.open) {
            pieces.push((&rest[..at], false));
            let after = &rest[at + self.open.len_utf8()..];
            let end = after.find(self.close).ok_or_else(|| {
                EngineError::Internal("the chat template altered a message's marker".into())
            })?;
            let literal = after[..end]
                .parse::<usize>()
                .ok()
                .and_then(|i| literals.get(i))
                .ok_or_else(|| {
                    EngineError::Internal("the chat template altered a message's marker".into())
                })?;
            pieces.push((literal.as_str(), true));
            rest = &after[end + self.close.len_utf8()..];
        }
        pieces.push((rest, false));
        Ok(pieces)
    }
}
