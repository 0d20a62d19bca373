//! WAV decoding and resampling: a tone written as a stereo 16-bit WAV at 44.1 kHz comes back
//! as the same tone at 16 kHz, in phase; the same rate is exact; bad files are errors.

use strata_media::{decode_wav, LogMel};

fn wav(rate: u32, channels: u16, seconds: f64, freq: f64) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut buf = std::io::Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut buf, spec).unwrap();
    let n = (rate as f64 * seconds) as usize;
    for i in 0..n {
        let v = (0.5 * (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin() * 32767.0)
            .round() as i16;
        for _ in 0..channels {
            w.write_sample(v).unwrap();
        }
    }
    w.finalize().unwrap();
    buf.into_inner()
}

#[test]
fn a_tone_resampled_to_16_khz_stays_the_same_tone_in_phase() {
    let clip = decode_wav(&wav(44_100, 2, 0.5, 440.0), 16_000, 30.0).unwrap();
    assert_eq!(clip.len(), 8_000);
    // Away from the edges, within a percent of the ideal tone at 16 kHz.
    let worst = (400..7_600)
        .map(|i| {
            let ideal = 0.5 * (2.0 * std::f64::consts::PI * 440.0 * i as f64 / 16_000.0).sin();
            (clip[i] as f64 - ideal).abs()
        })
        .fold(0.0f64, f64::max);
    assert!(worst < 0.005, "off the ideal tone by {worst}");
    // And its features have frames for the whole half second.
    let f = LogMel::gemma4().features(&clip);
    assert_eq!(f.mask.iter().filter(|&&m| m).count(), 49);
}

#[test]
fn the_extractor_rate_is_kept_sample_for_sample() {
    let clip = decode_wav(&wav(16_000, 1, 0.1, 1000.0), 16_000, 30.0).unwrap();
    assert_eq!(clip.len(), 1_600);
    let want = (0.5f64 * (2.0 * std::f64::consts::PI * 1000.0 * 3.0 / 16_000.0).sin() * 32767.0)
        .round() as f32
        / 32768.0;
    assert_eq!(clip[3], want);
}

#[test]
fn bad_or_long_audio_is_an_error() {
    let err = decode_wav(&wav(16_000, 1, 2.0, 440.0), 16_000, 1.0).unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
    assert!(decode_wav(b"RIFF....WAVEfmt nonsense", 16_000, 30.0).is_err());
    assert!(decode_wav(&[], 16_000, 30.0).is_err());
}

/// An MP3 (tests/fixtures/media/clip_0.mp3: clip_0.wav through LAME at 64 kb/s) decodes to
/// libsndfile's samples (`mp3_reference.safetensors`; both made by
/// scripts/reference/make_audio_chat_reference.py).
#[test]
fn an_mp3_decodes_to_libsndfiles_samples() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/media");
    let mp3 = std::fs::read(dir.join("clip_0.mp3")).unwrap();
    let reference = std::fs::read(dir.join("mp3_reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&reference).unwrap();
    let want: Vec<f32> = st
        .tensor("samples")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let got = strata_media::decode_mp3(&mp3, 16_000, 30.0).unwrap();
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("{} samples, largest difference {worst:.2e}", got.len());
    assert!(worst < 1e-3, "off libsndfile by {worst}");
    // A limit shorter than the clip stops the decode.
    let e = strata_media::decode_mp3(&mp3, 16_000, 0.3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("limit"), "{e}");
    assert!(strata_media::decode_mp3(b"ID3 not an mp3", 16_000, 30.0).is_err());
}
