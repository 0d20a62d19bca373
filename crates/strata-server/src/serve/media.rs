//! Chat media parts (`image_url`, `input_audio`): where each comes from, the limits they
//! are held to, and the rows the vision tower makes of them. Every refusal is a 400 naming
//! the part (`messages[1].content[2]`).

use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use strata_engine::{AudioFormat, MediaRows};

use super::error::ApiError;
use super::routes::AppState;

/// What clients may send as media (`--limit-mm-per-prompt`, `--max-image-bytes`,
/// `--allowed-media-domains`, `--media-fetch-timeout`).
#[derive(Clone, Debug)]
pub struct MediaPolicy {
    /// Images in one request at most.
    pub images: usize,
    /// Audio clips in one request at most.
    pub audios: usize,
    /// Bytes of one image file at most (decoded from base64, or fetched).
    pub max_image_bytes: usize,
    /// Bytes of one audio file at most (decoded from base64).
    pub max_audio_bytes: usize,
    /// Seconds of one audio clip at most.
    pub max_audio_seconds: f64,
    /// Hosts whose `http(s)://` image URLs are fetched (exact names); none by default.
    pub allowed_domains: Vec<String>,
    /// How long a fetch may take, connection to last byte.
    pub fetch_timeout: Duration,
}

impl Default for MediaPolicy {
    fn default() -> Self {
        Self {
            images: 8,
            audios: 1,
            max_image_bytes: 5 << 20,
            max_audio_bytes: 8 << 20,
            max_audio_seconds: 30.0,
            allowed_domains: Vec::new(),
            fetch_timeout: Duration::from_secs(10),
        }
    }
}

impl MediaPolicy {
    /// Bytes of request body the media may take (base64 is 4 bytes for 3).
    pub fn body_bytes(&self) -> usize {
        let images = self.images.saturating_mul(self.max_image_bytes);
        let audios = self.audios.saturating_mul(self.max_audio_bytes);
        images.saturating_add(audios).saturating_mul(4) / 3
    }

    /// Applies `--limit-mm-per-prompt`: `image=N,audio=M` or the JSON `{"image": N}`.
    pub fn set_limits(&mut self, spec: &str) -> Result<(), String> {
        let pairs: Vec<(String, String)> = if spec.trim_start().starts_with('{') {
            let v: serde_json::Map<String, Value> =
                serde_json::from_str(spec).map_err(|e| format!("not JSON: {e}"))?;
            v.into_iter().map(|(k, v)| (k, v.to_string())).collect()
        } else {
            spec.split(',')
                .filter(|p| !p.trim().is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
                    None => Err(format!("{p:?} is not KIND=COUNT")),
                })
                .collect::<Result<_, _>>()?
        };
        for (kind, n) in pairs {
            let n: usize = n
                .parse()
                .map_err(|_| format!("{kind}: {n:?} is not a count"))?;
            match kind.as_str() {
                "image" => self.images = n,
                "audio" => self.audios = n,
                other => return Err(format!("unknown media kind {other:?} (image, audio)")),
            }
        }
        Ok(())
    }
}

/// A media part of a chat: where it sits and its file, inline or to fetch.
#[derive(Clone, Debug)]
pub struct MediaPart {
    /// The part as the error names it: `messages[i].content[j]`.
    pub field: String,
    /// The file's bytes, or the URL to fetch them from.
    pub source: MediaSource,
}

/// Where a media item's bytes come from.
#[derive(Clone, Debug)]
pub enum MediaSource {
    /// A `data:` URL's image.
    Inline(Vec<u8>),
    /// An image at an `http(s)://` URL on an allowed host.
    Fetch(String),
    /// An `input_audio` part's file.
    Audio(Vec<u8>, AudioFormat),
}

impl MediaSource {
    fn is_audio(&self) -> bool {
        matches!(self, Self::Audio(..))
    }
}

impl MediaPart {
    /// Whether the part is an audio clip (not an image).
    pub fn is_audio(&self) -> bool {
        self.source.is_audio()
    }
}

/// Reads an `input_audio` part's value (`{"data": base64, "format": "wav" | "mp3"}`).
pub fn audio_part(
    field: String,
    value: &Value,
    policy: &MediaPolicy,
) -> Result<MediaPart, ApiError> {
    let bad = |msg: String| ApiError::invalid_owned(field.clone(), msg);
    let data = value
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("input_audio needs data (base64)".into()))?;
    let format = match value.get("format").and_then(Value::as_str) {
        Some("wav") => AudioFormat::Wav,
        Some("mp3") => AudioFormat::Mp3,
        Some(other) => return Err(bad(format!("audio format {other:?} is not wav or mp3"))),
        None => return Err(bad("input_audio needs format (wav or mp3)".into())),
    };
    if data.len() / 4 * 3 > policy.max_audio_bytes + 3 {
        return Err(bad(format!(
            "the audio has about {} bytes; this server accepts at most {} (--max-audio-bytes)",
            data.len() / 4 * 3,
            policy.max_audio_bytes
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(format!("the audio's base64 does not decode: {e}")))?;
    Ok(MediaPart {
        field,
        source: MediaSource::Audio(bytes, format),
    })
}

/// Image MIME types a `data:` URL may name (what the decoder reads).
const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/jpg", "image/webp"];

/// Reads an `image_url` part's value (`{"url": ...}`, or the URL alone) as the policy allows.
pub fn image_part(
    field: String,
    value: &Value,
    policy: &MediaPolicy,
) -> Result<MediaPart, ApiError> {
    let url = match value {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("url").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_owned(field.clone(), "image_url needs a url string")
        })?,
        _ => {
            return Err(ApiError::invalid_owned(
                field,
                "image_url must be an object with a url",
            ))
        }
    };
    let bad = |msg: String| ApiError::invalid_owned(field.clone(), msg);
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, payload) = rest
            .split_once(',')
            .ok_or_else(|| bad("a data: URL needs a comma before its payload".into()))?;
        let Some(mime) = meta.strip_suffix(";base64") else {
            return Err(bad(
                "a data: URL's image must be base64 (data:image/png;base64,...)".into(),
            ));
        };
        let mime = mime.to_ascii_lowercase();
        if !IMAGE_TYPES.contains(&mime.as_str()) {
            return Err(bad(format!(
                "{mime:?} is not an image type this server decodes (image/png, image/jpeg, image/webp)"
            )));
        }
        // Refused before decoding: base64 is 4 bytes for 3.
        if payload.len() / 4 * 3 > policy.max_image_bytes + 3 {
            return Err(too_big(&field, payload.len() / 4 * 3, policy));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(payload.trim())
            .map_err(|e| bad(format!("the image's base64 does not decode: {e}")))?;
        if bytes.len() > policy.max_image_bytes {
            return Err(too_big(&field, bytes.len(), policy));
        }
        return Ok(MediaPart {
            field,
            source: MediaSource::Inline(bytes),
        });
    }
    let host = url::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
        .ok_or_else(|| bad("image_url must be a data: URL or an http(s):// URL".into()))?;
    if !policy
        .allowed_domains
        .iter()
        .any(|d| d.eq_ignore_ascii_case(&host))
    {
        return Err(bad(format!(
            "images are not fetched from {host:?}: send a data: URL, or start the server with --allowed-media-domains {host}"
        )));
    }
    Ok(MediaPart {
        field,
        source: MediaSource::Fetch(url.to_string()),
    })
}

fn too_big(field: &str, bytes: usize, policy: &MediaPolicy) -> ApiError {
    ApiError::invalid_owned(
        field.to_string(),
        format!(
            "the image has {bytes} bytes; this server accepts at most {} (--max-image-bytes)",
            policy.max_image_bytes
        ),
    )
}

/// Fetches an allowed URL's bytes, bounded in size and time; redirects are not followed
/// (they could leave the allowed hosts).
fn fetch(field: &str, url: &str, policy: &MediaPolicy) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let bad = |msg: String| ApiError::invalid_owned(field.to_string(), msg);
    let agent = ureq::AgentBuilder::new()
        .timeout(policy.fetch_timeout)
        .redirects(0)
        .build();
    let resp = match agent.get(url).call() {
        Ok(r) if r.status() == 200 => r,
        Ok(r) => return Err(bad(format!("fetching the image gave HTTP {}", r.status()))),
        Err(ureq::Error::Status(code, _)) => {
            return Err(bad(format!("fetching the image gave HTTP {code}")))
        }
        Err(e) => return Err(bad(format!("fetching the image failed: {e}"))),
    };
    let mut bytes = Vec::new();
    resp.into_reader()
        .take(policy.max_image_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("reading the image failed: {e}")))?;
    if bytes.len() > policy.max_image_bytes {
        return Err(too_big(field, bytes.len(), policy));
    }
    Ok(bytes)
}

/// Requests decoding images or waiting for a vision tower pass at once: enough to fill a
/// pass (16 images) from requests of one or two images, and a bound on the decoded pixels
/// held (an image is at most about 8 MB of f32 patches).
pub const IMAGE_REQUESTS_AT_ONCE: usize = 8;

/// Fetches and encodes a request's media on the blocking pool; the engine thread never
/// waits for it. Audio clips run one request at a time (the host tower uses every core);
/// images are decoded here and then share tower passes with other requests' images
/// (`MediaEncoder::encode_decoded`).
pub async fn encode_media(
    st: &AppState,
    parts: Vec<MediaPart>,
) -> Result<Vec<MediaRows>, ApiError> {
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    check_taken(st, &parts)?;
    let Some(encoder) = st.engine.media.clone() else {
        return Ok(Vec::new());
    };
    let audio_slot = slot(&st.media_slots, parts.iter().any(|p| p.source.is_audio())).await?;
    let image_slot = slot(&st.image_slots, parts.iter().any(|p| !p.source.is_audio())).await?;
    let policy = st.media.clone();
    let out = tokio::task::spawn_blocking(move || {
        let at = |p: &MediaPart, e: strata_engine::EngineError| {
            ApiError::invalid_owned(p.field.clone(), e.to_string())
        };
        let mut out: Vec<Option<MediaRows>> = vec![None; parts.len()];
        let mut images = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let decoded = match &p.source {
                MediaSource::Inline(b) => encoder.decode_image(b),
                MediaSource::Fetch(url) => encoder.decode_image(&fetch(&p.field, url, &policy)?),
                MediaSource::Audio(b, f) => {
                    let rows = encoder.encode_audio(b, *f, policy.max_audio_seconds);
                    out[i] = Some(rows.map_err(|e| at(p, e))?);
                    continue;
                }
            };
            images.push((i, decoded.map_err(|e| at(p, e))?));
        }
        let (places, decoded): (Vec<usize>, Vec<_>) = images.into_iter().unzip();
        if let Some(&first) = places.first() {
            let rows = encoder
                .encode_decoded(decoded)
                .map_err(|e| at(&parts[first], e))?;
            for (i, r) in places.into_iter().zip(rows) {
                out[i] = Some(r);
            }
        }
        Ok(out.into_iter().flatten().collect())
    })
    .await
    .map_err(|e| {
        ApiError::from(strata_engine::EngineError::Internal(format!(
            "media encoding failed: {e}"
        )))
    })?;
    drop((audio_slot, image_slot));
    out
}

/// A permit of `sem` when `wanted`, waited for.
async fn slot(
    sem: &tokio::sync::Semaphore,
    wanted: bool,
) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, ApiError> {
    if !wanted {
        return Ok(None);
    }
    let permit = sem.acquire().await;
    permit
        .map(Some)
        .map_err(|_| ApiError::from(strata_engine::EngineError::Stopped))
}

/// Refuses, naming the first, the items of a kind this server has no tower for.
pub fn check_taken(st: &AppState, parts: &[MediaPart]) -> Result<(), ApiError> {
    let enc = st.engine.media.as_deref();
    for p in parts {
        let (taken, what) = if p.source.is_audio() {
            (enc.is_some_and(|e| e.takes_audio()), "audio")
        } else {
            (enc.is_some_and(|e| e.takes_images()), "images")
        };
        if !taken {
            let why = if st.text_model_only {
                format!(
                    "this server runs the text model only (--text-model-only): it takes no {what}"
                )
            } else if what == "audio" {
                "this model has no audio encoder: it takes no audio".to_string()
            } else {
                "this model has no vision encoder: it takes no images".to_string()
            };
            return Err(ApiError::invalid_owned(p.field.clone(), why));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> MediaPolicy {
        MediaPolicy {
            max_image_bytes: 8,
            allowed_domains: vec!["images.example.com".into()],
            ..Default::default()
        }
    }

    fn refusal(v: Value) -> String {
        let e = image_part("messages[0].content[1]".into(), &v, &policy()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[1]"));
        e.message
    }

    #[test]
    fn limits_parse_in_both_forms() {
        let mut p = MediaPolicy::default();
        p.set_limits("image=3,audio=0").unwrap();
        assert_eq!((p.images, p.audios), (3, 0));
        p.set_limits(r#"{"image": 5}"#).unwrap();
        assert_eq!((p.images, p.audios), (5, 0));
        assert!(p.set_limits("video=1").unwrap_err().contains("video"));
        assert!(p.set_limits("image").unwrap_err().contains("KIND=COUNT"));
        assert!(p
            .set_limits("image=-1")
            .unwrap_err()
            .contains("not a count"));
    }

    #[test]
    fn image_urls_are_read_or_refused_by_the_policy() {
        let ok = image_part(
            "f".into(),
            &serde_json::json!({"url": "data:image/PNG;base64,AAECAw=="}),
            &policy(),
        )
        .unwrap();
        assert!(matches!(ok.source, MediaSource::Inline(ref b) if b == &[0, 1, 2, 3]));
        let fetched = image_part(
            "f".into(),
            &Value::from("https://IMAGES.example.com/a.png"),
            &policy(),
        )
        .unwrap();
        assert!(matches!(fetched.source, MediaSource::Fetch(_)));
        for (v, words) in [
            (
                serde_json::json!({"url": "data:image/gif;base64,AAAA"}),
                "image/gif",
            ),
            (serde_json::json!({"url": "data:image/png,AAAA"}), "base64"),
            (serde_json::json!({"url": "data:image/png;base64"}), "comma"),
            (
                serde_json::json!({"url": "data:image/png;base64,AA!A"}),
                "decode",
            ),
            (
                serde_json::json!({"url": "data:image/png;base64,AAAAAAAAAAAAAAAA"}),
                "--max-image-bytes",
            ),
            (
                serde_json::json!({"url": "https://other.example.com/a.png"}),
                "--allowed-media-domains",
            ),
            (
                serde_json::json!({"url": "ftp://images.example.com/a"}),
                "http(s)",
            ),
            (serde_json::json!({}), "url"),
            (serde_json::json!(7), "object"),
        ] {
            let msg = refusal(v.clone());
            assert!(msg.contains(words), "{v}: {msg}");
        }
    }

    #[test]
    fn the_body_limit_makes_room_for_the_images() {
        let p = MediaPolicy {
            images: 2,
            max_image_bytes: 300,
            audios: 1,
            max_audio_bytes: 150,
            ..Default::default()
        };
        assert_eq!(p.body_bytes(), 1000);
    }
}
