//! Audio files -> mono samples at the rate an extractor wants: WAV decoded with `hound`
//! (8/16/24/32-bit integers, 32-bit floats), MP3 with `symphonia`; channels averaged, then
//! resampled with `rubato`'s FFT resampler when the rates differ.

use rubato::{FftFixedIn, Resampler};

use crate::MediaError;

/// Frames resampled a pass.
const CHUNK: usize = 1024;

/// A mono clip at `rate` from WAV bytes, refused past `max_seconds`.
pub fn decode_wav(bytes: &[u8], rate: usize, max_seconds: f64) -> Result<Vec<f32>, MediaError> {
    let bad = |e: hound::Error| MediaError::Invalid(format!("undecodable WAV: {e}"));
    let mut reader = hound::WavReader::new(std::io::Cursor::new(bytes)).map_err(bad)?;
    let spec = reader.spec();
    let channels = spec.channels as usize;
    let from = spec.sample_rate as usize;
    if channels == 0 || from == 0 {
        return Err(MediaError::Invalid(format!(
            "a WAV of {channels} channels at {from} Hz"
        )));
    }
    let seconds = reader.duration() as f64 / from as f64;
    if seconds > max_seconds {
        return Err(MediaError::Invalid(format!(
            "{seconds:.1} s of audio; the limit is {max_seconds} s"
        )));
    }
    let interleaved: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .samples::<f32>()
            .collect::<Result<_, _>>()
            .map_err(bad)?,
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            reader
                .samples::<i32>()
                .map(|s| s.map(|v| v as f32 * scale))
                .collect::<Result<_, _>>()
                .map_err(bad)?
        }
    };
    let mono: Vec<f32> = interleaved
        .chunks_exact(channels)
        .map(|f| f.iter().sum::<f32>() / channels as f32)
        .collect();
    resample(&mono, from, rate)
}

/// A mono clip at `rate` from MP3 bytes, refused past `max_seconds` (checked as frames
/// decode, so a long file stops early).
pub fn decode_mp3(bytes: &[u8], rate: usize, max_seconds: f64) -> Result<Vec<f32>, MediaError> {
    use symphonia::core::audio::SampleBuffer;
    use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
    use symphonia::core::formats::FormatOptions;
    use symphonia::core::io::MediaSourceStream;
    use symphonia::core::meta::MetadataOptions;
    use symphonia::core::probe::Hint;

    let bad = |e: &dyn std::fmt::Display| MediaError::Invalid(format!("undecodable MP3: {e}"));
    let source = MediaSourceStream::new(
        Box::new(std::io::Cursor::new(bytes.to_vec())),
        Default::default(),
    );
    let mut hint = Hint::new();
    hint.with_extension("mp3");
    // The encoder's delay and padding trimmed (LAME's gapless header), as libsndfile and
    // ffmpeg do: the samples line up with the clip that was encoded.
    let gapless = FormatOptions {
        enable_gapless: true,
        ..Default::default()
    };
    let probed = symphonia::default::get_probe()
        .format(&hint, source, &gapless, &MetadataOptions::default())
        .map_err(|e| bad(&e))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| bad(&"no audio track"))?;
    let track_id = track.id;
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| bad(&e))?;
    let (mut mono, mut from) = (Vec::new(), 0usize);
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(symphonia::core::errors::Error::IoError(e))
                if e.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                break
            }
            Err(e) => return Err(bad(&e)),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = decoder.decode(&packet).map_err(|e| bad(&e))?;
        let spec = *decoded.spec();
        let channels = spec.channels.count().max(1);
        from = spec.rate as usize;
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
        buf.copy_interleaved_ref(decoded);
        mono.extend(
            buf.samples()
                .chunks_exact(channels)
                .map(|f| f.iter().sum::<f32>() / channels as f32),
        );
        if from > 0 && mono.len() as f64 / from as f64 > max_seconds {
            return Err(MediaError::Invalid(format!(
                "more than {max_seconds} s of audio; the limit is {max_seconds} s"
            )));
        }
    }
    if from == 0 || mono.is_empty() {
        return Err(bad(&"no audio frames"));
    }
    resample(&mono, from, rate)
}

/// `clip` from `from` Hz to `to` Hz: `round(len * to / from)` samples, aligned with the
/// input (the resampler's delay removed).
pub fn resample(clip: &[f32], from: usize, to: usize) -> Result<Vec<f32>, MediaError> {
    if from == to {
        return Ok(clip.to_vec());
    }
    let err = |e: &dyn std::fmt::Display| MediaError::Invalid(format!("resampling: {e}"));
    let mut r = FftFixedIn::<f32>::new(from, to, CHUNK, 2, 1).map_err(|e| err(&e))?;
    let want = (clip.len() as f64 * to as f64 / from as f64).round() as usize;
    let delay = r.output_delay();
    let mut out: Vec<f32> = Vec::with_capacity(want + delay + CHUNK);
    let mut at = 0;
    while out.len() < want + delay {
        let need = r.input_frames_next();
        let chunk = if at + need <= clip.len() {
            let c = r.process(&[&clip[at..at + need]], None);
            at += need;
            c
        } else if at < clip.len() {
            let c = r.process_partial(Some(&[&clip[at..]]), None);
            at = clip.len();
            c
        } else {
            r.process_partial::<&[f32]>(None, None)
        };
        out.extend_from_slice(&chunk.map_err(|e| err(&e))?[0]);
    }
    Ok(out[delay..delay + want].to_vec())
}
