//! Decoding an uploaded audio file to what Whisper listens to: 16 kHz mono
//! f32 samples in [-1, 1].
//!
//! Containers and codecs (symphonia, pure Rust): WAV (PCM 8/16/24/32-bit
//! integer, 32/64-bit float), FLAC, MP3, Ogg Vorbis, AAC-LC in MP4/M4A or
//! as ADTS. Channels are mixed to mono by their mean; any other sample rate
//! is resampled to 16 kHz by rubato's FFT resampler (band-limited,
//! deterministic for a given input and CPU; skipped at 16 kHz).
//!
//! Every input is untrusted, so every step is bounded ([`AudioLimits`]): the
//! file's size is checked first; the container's declared duration, where it
//! has one, before decoding; and the decoded duration after every packet,
//! so a file that lies about its length stops as soon as it passes the
//! limit. Nothing is buffered beyond one packet, one resampler chunk and the
//! 16-kHz output, which the duration limit bounds.
//!
//! Damage:
//! - a packet that fails to decode (a damaged AAC frame), or a jump in the
//!   packets' timestamps where the demuxer skipped damaged data (a FLAC
//!   frame failing its CRC), is skipped, as ffmpeg (and so Whisper's
//!   loaders) would; its audio is missing, not replaced by silence. Skips
//!   are counted in [`Audio::skipped_packets`], and more than
//!   [`MAX_BAD_PACKETS`] fail the file ([`AudioError::TooManyBadPackets`]):
//!   past a few, the file is damaged, not unlucky. MP3 and ADTS demuxers
//!   resync past damage and count time themselves, so their losses go
//!   uncounted.
//! - a file that ends early fails with [`AudioError::Truncated`], saying
//!   how much decoded: where its packets stop more than 0.1 s short of the
//!   length the container declares (WAV, FLAC, Ogg, MP4), or its bytes end
//!   before any audio (a cut header; an MP4 cut before its index reads as
//!   [`AudioError::UnsupportedFormat`]). A partial transcript returned as a
//!   success would hide the loss. Streams whose length is unknown (a WAV
//!   written to a pipe, sizes 0xFFFFFFFF) or only estimated (MP3, ADTS)
//!   decode to where their bytes end, as ffmpeg does.
//! - malformed container data fails with [`AudioError::Corrupt`] (the
//!   demuxer's message, and the time once audio has started): symphonia's
//!   Ogg reader, for one, stops at a page that fails its CRC.
//! - AAC: symphonia applies neither MP4 edit lists nor ADTS priming, so the
//!   encoder's priming (1024 frames from ffmpeg, 2112 from Apple's
//!   encoders: 20–50 ms) stays at the start, where ffmpeg would drop it.
//!   MP3 and Vorbis delay and padding are trimmed (gapless decoding).

use std::io::Cursor;

use rubato::audioadapter_buffers::direct::SequentialSlice;
use rubato::{Fft, FixedSync, Indexing, Resampler, WindowFunction};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType, well_known};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::units::TimeBase;

/// The sample rate of [`Audio::samples`], Whisper's, in Hz.
pub const SAMPLE_RATE: u32 = 16_000;

/// Packets that may fail to decode before the whole file is refused.
pub const MAX_BAD_PACKETS: usize = 8;

/// The lowest source sample rate accepted, in Hz (below telephony's 8 kHz
/// there is no speech band left to transcribe; lower "rates" are corrupt
/// headers).
pub const MIN_SOURCE_RATE: u32 = 1_000;

/// The highest source sample rate accepted, in Hz (the highest rate audio
/// interfaces record at).
pub const MAX_SOURCE_RATE: u32 = 768_000;

/// Input frames per resampler call: large enough that the FFT resampler's
/// blocks (the smallest multiple of `rate / gcd(rate, 16000)` at or above
/// this) give a sharp anti-aliasing filter, small enough to stay in cache.
const RESAMPLE_CHUNK: usize = 4096;

/// Bounds on one decode: what an input may cost this process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AudioLimits {
    /// The largest file accepted, in bytes (checked before anything is
    /// read).
    pub max_bytes: usize,
    /// The longest audio accepted, in seconds at the source's rate (checked
    /// against the container's declared length, then while decoding).
    pub max_seconds: f64,
}

impl AudioLimits {
    /// 1 GiB: every compressed file of [`Self::DEFAULT_MAX_SECONDS`] fits
    /// (4 h of MP3 at 320 kb/s is 576 MB), as do 16-kHz 16-bit WAVs of that
    /// length (460 MB); a 44.1-kHz stereo WAV fits up to 1.7 h. The file is
    /// held in memory whole while it decodes.
    pub const DEFAULT_MAX_BYTES: usize = 1 << 30;
    /// 4 hours: long meetings, lectures and podcast episodes pass; the
    /// 16-kHz output is then 230 M samples (922 MB), the most a decode
    /// holds.
    pub const DEFAULT_MAX_SECONDS: f64 = 4.0 * 3600.0;
}

impl Default for AudioLimits {
    fn default() -> Self {
        Self {
            max_bytes: Self::DEFAULT_MAX_BYTES,
            max_seconds: Self::DEFAULT_MAX_SECONDS,
        }
    }
}

/// A decoded file, ready for [`super::mel`].
#[derive(Clone, Debug, PartialEq)]
pub struct Audio {
    /// Mono samples at [`SAMPLE_RATE`], each in [-1, 1] (clamped; non-finite
    /// source samples read as 0). Their count is the source's frames × 16000
    /// / `source_rate`, rounded up.
    pub samples: Vec<f32>,
    /// The source's sample rate, in Hz.
    pub source_rate: u32,
    /// The source's channel count (mixed by their mean), at least 1.
    pub source_channels: usize,
    /// The decoded audio's duration: source frames / `source_rate`.
    pub duration_s: f64,
    /// The container's short name (e.g. `wave`, `mp3`, `isomp4`, for logs).
    pub container: &'static str,
    /// The codec's short name (e.g. `pcm_s16le`, `mp3`, `aac`, for logs).
    pub codec: &'static str,
    /// Packets lost to damage and skipped (at most [`MAX_BAD_PACKETS`]):
    /// those that failed to decode, and gaps where the demuxer skipped
    /// damaged data (see the module's doc).
    pub skipped_packets: usize,
}

/// Why an audio file could not be decoded. Each is a property of the input
/// (retrying the same bytes gives the same error).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AudioError {
    /// The file is larger than [`AudioLimits::max_bytes`].
    #[error("audio file is {bytes} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// The file's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The audio is longer than [`AudioLimits::max_seconds`].
    #[error("audio is longer than the limit of {limit_s} s (at least {seconds:.1} s)")]
    TooLong {
        /// The duration found so far (the declared one, or what decoded
        /// before decoding stopped): a lower bound.
        seconds: f64,
        /// The limit.
        limit_s: f64,
    },
    /// The input has no bytes.
    #[error("audio file is empty (0 bytes)")]
    EmptyFile,
    /// The bytes are not a container this decoder reads.
    #[error(
        "not a supported audio file ({0}); accepted: WAV, FLAC, MP3, Ogg Vorbis, AAC (M4A/MP4 or ADTS)"
    )]
    UnsupportedFormat(String),
    /// The container is read but its audio cannot be decoded here: another
    /// codec, a sample rate out of range, a stream whose format changes.
    #[error("unsupported audio stream: {0}")]
    UnsupportedStream(String),
    /// The container has no audio track.
    #[error("the file has no audio track")]
    NoAudioTrack,
    /// The container's structure is malformed (the demuxer's or decoder's
    /// message, with the time reached once audio has started).
    #[error("corrupt audio file: {0}")]
    Corrupt(String),
    /// The file ends early: its audio stops more than 0.1 s short of the
    /// length its container declares, or its bytes end before any audio.
    #[error("audio file is truncated or damaged after {decoded_s:.2} s: {reason}")]
    Truncated {
        /// Seconds of audio decoded.
        decoded_s: f64,
        /// Where the audio stops against the declared length, and the
        /// demuxer's message if it ran out of bytes.
        reason: String,
    },
    /// More than [`MAX_BAD_PACKETS`] packets were lost to damage.
    #[error("audio data is damaged: {count} packets lost; the last: {last}")]
    TooManyBadPackets {
        /// Packets lost.
        count: usize,
        /// The last loss's message.
        last: String,
    },
    /// The audio track decodes to no samples.
    #[error("the audio track holds no samples")]
    Empty,
    /// The resampler refused the stream (its message).
    #[error("resampling {rate} Hz audio to 16 kHz failed: {reason}")]
    Resample {
        /// The source's rate.
        rate: u32,
        /// The resampler's message.
        reason: String,
    },
}

/// Decodes `bytes`, a whole audio file, to 16-kHz mono within `limits`.
/// `hint` is the file's extension if known (`"mp3"`, `".M4A"`): it settles
/// formats that probe alike; the contents decide otherwise.
pub fn decode(bytes: &[u8], hint: Option<&str>, limits: &AudioLimits) -> Result<Audio, AudioError> {
    if bytes.len() > limits.max_bytes {
        return Err(AudioError::TooLarge {
            bytes: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    if bytes.is_empty() {
        return Err(AudioError::EmptyFile);
    }
    let source = MediaSourceStream::new(
        Box::new(Cursor::new(bytes)),
        MediaSourceStreamOptions::default(),
    );
    let mut probe_hint = Hint::new();
    if let Some(ext) = hint {
        probe_hint.with_extension(&ext.trim_start_matches('.').to_ascii_lowercase());
    }
    let mut reader = symphonia::default::get_probe()
        .probe(
            &probe_hint,
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            SymphoniaError::Unsupported(m) => AudioError::UnsupportedFormat(m.to_string()),
            SymphoniaError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                AudioError::Truncated {
                    decoded_s: 0.0,
                    reason: format!("the file ends before its audio starts ({e})"),
                }
            }
            other => AudioError::Corrupt(other.to_string()),
        })?;
    let container = reader.format_info().short_name;

    let track = reader
        .default_track(TrackType::Audio)
        .ok_or(AudioError::NoAudioTrack)?;
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or(AudioError::NoAudioTrack)?
        .clone();
    let timeline = Timeline::new(track.time_base, params.sample_rate);
    // MP3 and ADTS readers estimate a length from the file's size (or an
    // MP3's Xing header, which cannot be told from an estimate here): no
    // declaration to hold the file to.
    let format = reader.format_info().format;
    let declared_s = if format == well_known::FORMAT_ID_MP3 || format == well_known::FORMAT_ID_ADTS
    {
        None
    } else {
        timeline.declared_seconds(
            track.duration.map(|d| d.get()),
            track.num_frames,
            params.sample_rate,
        )
    };
    // The declared length, where the container has one, fails a long file
    // before any of it decodes.
    if let Some(seconds) = declared_s
        && seconds > limits.max_seconds
    {
        return Err(AudioError::TooLong {
            seconds,
            limit_s: limits.max_seconds,
        });
    }
    let declared_frames = track.num_frames;

    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| AudioError::UnsupportedStream(format!("codec {:?}: {e}", params.codec)))?;
    let codec = decoder.codec_info().short_name;

    let mut stream: Option<Stream> = None;
    let mut interleaved: Vec<f32> = Vec::new();
    let mut mono: Vec<f32> = Vec::new();
    let mut bad = BadPackets::default();
    // Where the last packet's audio ends, in the track's time base.
    let mut end_ts: Option<i64> = None;
    let mut last_block = 0u64;
    // The bytes ran out inside a packet or structure (the demuxer's words).
    let mut cut: Option<String> = None;

    loop {
        let packet = match reader.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            Err(SymphoniaError::ResetRequired) => {
                return Err(AudioError::UnsupportedStream(
                    "the track list changes mid-file (chained Ogg streams)".into(),
                ));
            }
            // The end, if nothing says there should be more (checked below):
            // a stream of unknown length (a WAV written to a pipe) ends so.
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                cut = Some(e.to_string());
                break;
            }
            Err(e) => {
                return Err(AudioError::Corrupt(match &stream {
                    Some(s) => format!("after {:.2} s: {e}", s.seconds()),
                    None => e.to_string(),
                }));
            }
        };
        if packet.track_id != track_id {
            continue;
        }
        // A packet that starts a whole packet or more after the previous
        // one ended: the demuxer dropped damaged data in between (FLAC's
        // resyncs so). Counted as a lost packet.
        let pts = packet.pts.get();
        let block = packet.block_dur().get();
        if let Some(end) = end_ts
            && pts.saturating_sub(end) >= i64::try_from(last_block.max(1)).unwrap_or(i64::MAX)
        {
            bad.push("audio missing between packets (damaged data skipped by the demuxer)".into())?;
        }
        let this_end = pts.saturating_add(i64::try_from(block).unwrap_or(i64::MAX));
        end_ts = Some(end_ts.map_or(this_end, |e| e.max(this_end)));
        last_block = block;

        let buffer = match decoder.decode(&packet) {
            Ok(buffer) => buffer,
            Err(e @ (SymphoniaError::DecodeError(_) | SymphoniaError::IoError(_))) => {
                bad.push(e.to_string())?;
                continue;
            }
            // Damaged data often reads as a feature the decoder lacks; once
            // the stream has decoded, that is how it is counted.
            Err(SymphoniaError::Unsupported(m)) if stream.is_some() => {
                bad.push(format!("{codec}: {m}"))?;
                continue;
            }
            Err(SymphoniaError::Unsupported(m)) => {
                return Err(AudioError::UnsupportedStream(format!("{codec}: {m}")));
            }
            Err(e) => return Err(AudioError::Corrupt(format!("{codec}: {e}"))),
        };
        if buffer.frames() == 0 {
            continue;
        }
        let rate = buffer.spec().rate();
        let channels = buffer.spec().channels().count();
        if stream.is_none() {
            stream = Some(Stream::new(rate, channels, declared_frames, limits)?);
        }
        let Some(s) = stream.as_mut() else {
            continue;
        };
        if (s.rate, s.channels) != (rate, channels) {
            return Err(AudioError::UnsupportedStream(format!(
                "the stream changes from {} Hz × {} channels to {rate} Hz × {channels} mid-file",
                s.rate, s.channels
            )));
        }
        buffer.copy_to_vec_interleaved(&mut interleaved);
        mix_to_mono(&interleaved, channels, &mut mono);
        s.push(&mono, limits)?;
    }

    // Audio missing at the end: the packets' timeline stops more than
    // 0.1 s short of the declared length (whether the demuxer ran out of
    // bytes or stopped cleanly), or the bytes ran out before any audio.
    let decoded_s = stream.as_ref().map_or(0.0, Stream::seconds);
    let reached_s = end_ts.and_then(|ts| timeline.seconds(ts)).unwrap_or(0.0);
    if let Some(declared) = declared_s
        && reached_s + 0.1 < declared
    {
        return Err(AudioError::Truncated {
            decoded_s,
            reason: format!(
                "its audio stops at {reached_s:.2} s of the {declared:.2} s it declares{}",
                cut.map(|w| format!(" ({w})")).unwrap_or_default()
            ),
        });
    }
    let Some(stream) = stream else {
        return Err(match cut {
            Some(why) => AudioError::Truncated {
                decoded_s: 0.0,
                reason: why,
            },
            None => AudioError::Empty,
        });
    };
    let (source_rate, source_channels, duration_s) =
        (stream.rate, stream.channels, stream.seconds());
    let mut samples = stream.resampler.finish()?;
    if samples.is_empty() {
        return Err(AudioError::Empty);
    }
    for s in &mut samples {
        *s = s.clamp(-1.0, 1.0);
    }
    Ok(Audio {
        samples,
        source_rate,
        source_channels,
        duration_s,
        container,
        codec,
        skipped_packets: bad.count,
    })
}

/// A track's time base: timestamps to seconds.
#[derive(Clone, Copy)]
struct Timeline {
    /// Seconds per timestamp unit; `None` when neither a time base nor a
    /// sample rate is known.
    unit_s: Option<f64>,
}

impl Timeline {
    /// The track's time base, else one unit per frame at `rate`.
    fn new(time_base: Option<TimeBase>, rate: Option<u32>) -> Self {
        let unit_s = match (time_base, rate) {
            (Some(tb), _) => Some(f64::from(tb.numer.get()) / f64::from(tb.denom.get())),
            (None, Some(rate)) if rate > 0 => Some(1.0 / f64::from(rate)),
            _ => None,
        };
        Self { unit_s }
    }

    fn seconds(&self, ts: i64) -> Option<f64> {
        self.unit_s.map(|u| ts as f64 * u)
    }

    /// The track's declared length in seconds: its duration, else its
    /// frame count at `rate`.
    fn declared_seconds(
        &self,
        duration: Option<u64>,
        frames: Option<u64>,
        rate: Option<u32>,
    ) -> Option<f64> {
        match (duration, frames, rate) {
            (Some(d), _, _) => self.unit_s.map(|u| d as f64 * u),
            (None, Some(f), Some(rate)) if rate > 0 => Some(f as f64 / f64::from(rate)),
            _ => None,
        }
    }
}

/// Packets lost to damage so far, at most [`MAX_BAD_PACKETS`].
#[derive(Default)]
struct BadPackets {
    count: usize,
}

impl BadPackets {
    /// Counts one more; fails once there are more than [`MAX_BAD_PACKETS`].
    fn push(&mut self, why: String) -> Result<(), AudioError> {
        self.count += 1;
        if self.count > MAX_BAD_PACKETS {
            return Err(AudioError::TooManyBadPackets {
                count: self.count,
                last: why,
            });
        }
        Ok(())
    }
}

/// `interleaved` frames of `channels` samples, averaged into `mono`
/// (replacing its contents); non-finite samples count as 0.
fn mix_to_mono(interleaved: &[f32], channels: usize, mono: &mut Vec<f32>) {
    mono.clear();
    let finite = |s: f32| if s.is_finite() { s } else { 0.0 };
    if channels == 1 {
        mono.extend(interleaved.iter().map(|&s| finite(s)));
    } else {
        let scale = 1.0 / channels as f32;
        mono.extend(
            interleaved
                .chunks_exact(channels)
                .map(|frame| frame.iter().map(|&s| finite(s)).sum::<f32>() * scale),
        );
    }
}

/// The decoded stream's shape, fixed by its first buffer, and where its
/// samples go.
struct Stream {
    rate: u32,
    channels: usize,
    /// Source frames decoded so far.
    frames: u64,
    /// [`AudioLimits::max_seconds`] in source frames.
    max_frames: f64,
    resampler: To16k,
}

impl Stream {
    fn new(
        rate: u32,
        channels: usize,
        declared_frames: Option<u64>,
        limits: &AudioLimits,
    ) -> Result<Self, AudioError> {
        if !(MIN_SOURCE_RATE..=MAX_SOURCE_RATE).contains(&rate) {
            return Err(AudioError::UnsupportedStream(format!(
                "sample rate {rate} Hz (accepted: {MIN_SOURCE_RATE}..={MAX_SOURCE_RATE} Hz)"
            )));
        }
        if channels == 0 {
            return Err(AudioError::Corrupt(
                "the stream declares no channels".into(),
            ));
        }
        let max_frames = limits.max_seconds * f64::from(rate);
        // Room for the declared length, so the output of a long file does
        // not grow by copying; at most 10 minutes' worth, as the
        // declaration is the file's word.
        let expected = declared_frames
            .map(|f| (f as f64).min(max_frames) * f64::from(SAMPLE_RATE) / f64::from(rate))
            .unwrap_or(0.0)
            .min(f64::from(SAMPLE_RATE) * 600.0);
        Ok(Self {
            rate,
            channels,
            frames: 0,
            max_frames,
            resampler: To16k::new(rate, expected as usize + 1)?,
        })
    }

    fn seconds(&self) -> f64 {
        self.frames as f64 / f64::from(self.rate)
    }

    /// Takes one buffer's mono frames; fails as soon as the total passes
    /// the duration limit.
    fn push(&mut self, mono: &[f32], limits: &AudioLimits) -> Result<(), AudioError> {
        self.frames += mono.len() as u64;
        // A NaN limit refuses rather than admits.
        if self.frames as f64 > self.max_frames || self.max_frames.is_nan() {
            return Err(AudioError::TooLong {
                seconds: self.seconds(),
                limit_s: limits.max_seconds,
            });
        }
        self.resampler.push(mono)
    }
}

/// Streaming conversion of one mono channel to 16 kHz: a pass-through at
/// 16 kHz, else rubato's FFT resampler fed fixed chunks as they fill, its
/// start-up delay dropped so output sample `i` is at time `i / 16000`.
struct To16k {
    rate: u32,
    /// `None` at 16 kHz.
    fft: Option<Box<Fft<f32>>>,
    /// Input waiting for a full chunk (less than one chunk between calls).
    pending: Vec<f32>,
    /// One call's output.
    scratch: Vec<f32>,
    out: Vec<f32>,
    /// Output frames still to drop: the resampler's delay.
    to_trim: usize,
    /// Input frames taken.
    frames_in: u64,
}

impl To16k {
    fn new(rate: u32, reserve: usize) -> Result<Self, AudioError> {
        let err = |e: &dyn std::fmt::Display| AudioError::Resample {
            rate,
            reason: e.to_string(),
        };
        let fft = if rate == SAMPLE_RATE {
            None
        } else {
            Some(Box::new(
                Fft::<f32>::new_custom(
                    rate as usize,
                    SAMPLE_RATE as usize,
                    RESAMPLE_CHUNK,
                    1,
                    1,
                    WindowFunction::BlackmanHarris2,
                    FixedSync::Input,
                )
                .map_err(|e| err(&e))?,
            ))
        };
        let (scratch, to_trim) = match &fft {
            Some(f) => (vec![0.0; f.output_frames_max()], f.output_delay()),
            None => (Vec::new(), 0),
        };
        Ok(Self {
            rate,
            fft,
            pending: Vec::new(),
            scratch,
            out: Vec::with_capacity(reserve),
            to_trim,
            frames_in: 0,
        })
    }

    fn push(&mut self, mono: &[f32]) -> Result<(), AudioError> {
        self.frames_in += mono.len() as u64;
        let Some(fft) = self.fft.as_deref_mut() else {
            self.out.extend_from_slice(mono);
            return Ok(());
        };
        self.pending.extend_from_slice(mono);
        let mut used = 0;
        loop {
            let need = fft.input_frames_next();
            if self.pending.len() - used < need {
                break;
            }
            let chunk = &self.pending[used..used + need];
            let produced = run(fft, chunk, None, &mut self.scratch, self.rate)?;
            keep(&self.scratch[..produced], &mut self.to_trim, &mut self.out);
            used += need;
        }
        self.pending.drain(..used);
        Ok(())
    }

    /// The 16-kHz samples: `ceil(frames_in × 16000 / rate)` of them.
    fn finish(mut self) -> Result<Vec<f32>, AudioError> {
        let Some(mut fft) = self.fft.take() else {
            return Ok(self.out);
        };
        let rate = u64::from(self.rate);
        let expected = usize::try_from((self.frames_in * u64::from(SAMPLE_RATE)).div_ceil(rate))
            .unwrap_or(usize::MAX);
        let need = fft.input_frames_next();
        let left = self.pending.len();
        self.pending.resize(need.max(left), 0.0);
        if left > 0 {
            let produced = run(
                &mut fft,
                &self.pending,
                Some(left),
                &mut self.scratch,
                self.rate,
            )?;
            keep(&self.scratch[..produced], &mut self.to_trim, &mut self.out);
        }
        // Flush the delay line with silence until the tail is out. A call
        // yields whole FFT blocks or nothing, so up to a block's worth of
        // chunks may pass with no output; more means it is stuck.
        let max_idle = fft.fft_size_in() / need.max(1) + 2;
        let mut idle = 0;
        while self.out.len() < expected && idle <= max_idle {
            let produced = run(
                &mut fft,
                &self.pending,
                Some(0),
                &mut self.scratch,
                self.rate,
            )?;
            idle = if produced == 0 { idle + 1 } else { 0 };
            keep(&self.scratch[..produced], &mut self.to_trim, &mut self.out);
        }
        self.out.truncate(expected);
        Ok(self.out)
    }
}

/// One resampler call on `input` (`partial` valid frames, or all), into
/// `scratch`; returns the frames produced.
fn run(
    fft: &mut Fft<f32>,
    input: &[f32],
    partial: Option<usize>,
    scratch: &mut [f32],
    rate: u32,
) -> Result<usize, AudioError> {
    let err = |e: &dyn std::fmt::Display| AudioError::Resample {
        rate,
        reason: e.to_string(),
    };
    let input = SequentialSlice::new(input, 1, input.len()).map_err(|e| err(&e))?;
    let frames = scratch.len();
    let mut output = SequentialSlice::new_mut(scratch, 1, frames).map_err(|e| err(&e))?;
    let indexing = partial.map(|n| Indexing::new().partial_len(n));
    let (_, produced) = fft
        .process_into_buffer(&input, &mut output, indexing.as_ref())
        .map_err(|e| err(&e))?;
    Ok(produced)
}

/// Appends `produced` to `out` after dropping what is left of the delay.
fn keep(produced: &[f32], to_trim: &mut usize, out: &mut Vec<f32>) {
    let skip = (*to_trim).min(produced.len());
    *to_trim -= skip;
    out.extend_from_slice(&produced[skip..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn fixture(name: &str) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let path = format!(
            "{}/../../tests/fixtures/speech/formats/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        Ok(std::fs::read(path)?)
    }

    fn decode_fixture(name: &str) -> Result<Audio, Box<dyn std::error::Error>> {
        let ext = name.rsplit('.').next();
        Ok(decode(&fixture(name)?, ext, &AudioLimits::default())?)
    }

    /// The largest normalised cross-correlation of `a` against `b` over
    /// lags in `-max_lag..=max_lag` (`a[i + lag]` against `b[i]`), over the
    /// samples they share.
    fn best_correlation(a: &[f32], b: &[f32], max_lag: isize) -> (f64, isize) {
        let mut best = (f64::MIN, 0);
        for lag in -max_lag..=max_lag {
            let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
            for (i, &y) in b.iter().enumerate() {
                let j = i as isize + lag;
                if j < 0 || j as usize >= a.len() {
                    continue;
                }
                let x = a[j as usize];
                ab += f64::from(x) * f64::from(y);
                aa += f64::from(x) * f64::from(x);
                bb += f64::from(y) * f64::from(y);
            }
            let c = ab / (aa * bb).sqrt().max(1e-12);
            if c > best.0 {
                best = (c, lag);
            }
        }
        best
    }

    /// A WAV file of `channels` interleaved `samples` at `rate` Hz: PCM
    /// integers of `bits` bits (8 unsigned, 16/24/32 signed) or, with
    /// `float`, IEEE 32-bit floats.
    fn wav(samples: &[f32], channels: u16, rate: u32, bits: u16, float: bool) -> Vec<u8> {
        let bytes_per = usize::from(bits / 8);
        let mut data = Vec::with_capacity(samples.len() * bytes_per);
        for &s in samples {
            let s = f64::from(s.clamp(-1.0, 1.0));
            match (bits, float) {
                (32, true) => data.extend_from_slice(&(s as f32).to_le_bytes()),
                (8, false) => data.push((s * 127.0 + 128.0).round() as u8),
                (16, false) => {
                    data.extend_from_slice(&((s * 32767.0).round() as i16).to_le_bytes())
                }
                (24, false) => {
                    data.extend_from_slice(&((s * 8_388_607.0).round() as i32).to_le_bytes()[..3])
                }
                (32, false) => {
                    data.extend_from_slice(&((s * 2_147_483_647.0).round() as i32).to_le_bytes())
                }
                _ => unreachable!("test WAV format"),
            }
        }
        let block = channels * bits / 8;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&(if float { 3u16 } else { 1u16 }).to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&bits.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
        out
    }

    fn tone(n: usize, rate: u32, hz: f64, amp: f64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (amp * (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin()) as f32
            })
            .collect()
    }

    /// The reference WAV is already 16 kHz mono: decoded as is.
    #[test]
    fn wav_at_16k_is_not_resampled() -> TestResult {
        let audio = decode_fixture("speech_16k_mono.wav")?;
        assert_eq!((audio.source_rate, audio.source_channels), (16_000, 1));
        assert_eq!(audio.samples.len(), 24_000);
        assert!((audio.duration_s - 1.5).abs() < 1e-9);
        assert_eq!((audio.container, audio.codec), ("wave", "pcm_s16le"));
        let raw = fixture("speech_16k_mono.wav")?;
        let first = i16::from_le_bytes([raw[44], raw[45]]);
        assert_eq!(audio.samples[0], f32::from(first) / 32768.0);
        Ok(())
    }

    /// Every container and codec decodes to 16 kHz mono of about the clip's
    /// length, and sounds like the reference (correlation after aligning
    /// the codec's delay).
    #[test]
    fn formats_decode_like_the_reference() -> TestResult {
        let reference = decode_fixture("speech_16k_mono.wav")?.samples;
        for (name, rate, channels, seconds, min_corr) in [
            ("speech_44k_stereo.wav", 44_100, 2, 0.3, 0.999),
            ("speech.flac", 22_050, 2, 1.5, 0.999),
            ("speech.mp3", 44_100, 2, 1.5, 0.95),
            ("speech.ogg", 48_000, 2, 1.5, 0.95),
            ("speech.m4a", 44_100, 2, 1.5, 0.95),
            ("speech.aac", 48_000, 1, 1.5, 0.95),
        ] {
            let audio = decode_fixture(name)?;
            assert_eq!(
                (audio.source_rate, audio.source_channels),
                (rate, channels),
                "{name}"
            );
            assert!(
                (audio.duration_s - seconds).abs() <= 0.05,
                "{name}: {} s",
                audio.duration_s
            );
            let expected = (audio.duration_s * 16_000.0).ceil() as usize;
            assert_eq!(audio.samples.len(), expected, "{name}");
            assert!(
                audio.samples.iter().all(|s| (-1.0..=1.0).contains(s)),
                "{name}"
            );
            let n = audio.samples.len().min(reference.len());
            let (corr, lag) = best_correlation(&audio.samples[..n], &reference[..n], 1600);
            assert!(
                corr >= min_corr,
                "{name}: correlation {corr:.3} at lag {lag}"
            );
            // A stereo file's mix is 0.75 × the clip: the level survives.
            let rms = |x: &[f32]| {
                (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
            };
            let ratio = rms(&audio.samples[..n]) / rms(&reference[..n]);
            let level = if channels == 2 { 0.75 } else { 1.0 };
            assert!(
                (ratio / level - 1.0).abs() < 0.15,
                "{name}: level ratio {ratio:.3}"
            );
            eprintln!(
                "{name}: {} {}, {:.3} s, correlation {corr:.4} at lag {lag}, level {ratio:.3}",
                audio.container, audio.codec, audio.duration_s
            );
        }
        Ok(())
    }

    /// WAV of each integer width and of floats, mono and stereo, decode to
    /// the same tone, at the right level.
    #[test]
    fn wav_sample_formats() -> TestResult {
        let rate = 16_000;
        let mono = tone(8_000, rate, 440.0, 0.5);
        for (bits, float) in [
            (8, false),
            (16, false),
            (24, false),
            (32, false),
            (32, true),
        ] {
            let audio = decode(
                &wav(&mono, 1, rate, bits, float),
                Some("wav"),
                &AudioLimits::default(),
            )?;
            assert_eq!(audio.samples.len(), mono.len(), "{bits}-bit");
            let tolerance = if bits == 8 { 1.0 / 64.0 } else { 1e-4 };
            let worst = audio
                .samples
                .iter()
                .zip(&mono)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= tolerance, "{bits}-bit float={float}: {worst}");
        }
        // Stereo: the mean of the channels.
        let stereo: Vec<f32> = mono.iter().flat_map(|&s| [s, 0.0]).collect();
        let audio = decode(
            &wav(&stereo, 2, rate, 16, false),
            None,
            &AudioLimits::default(),
        )?;
        assert_eq!(audio.source_channels, 2);
        let worst = audio
            .samples
            .iter()
            .zip(&mono)
            .map(|(a, b)| (a - b / 2.0).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "stereo mix: {worst}");
        Ok(())
    }

    /// The resampled length is the source's duration at 16 kHz, rounded
    /// up, whatever the rate and length.
    #[test]
    fn resampled_lengths() -> TestResult {
        for rate in [8_000u32, 11_025, 22_050, 44_100, 48_000, 44_101, 96_000] {
            for n in [1usize, 159, 4_410, 4_096 * 3 + 17, rate as usize * 7 + 3] {
                let audio = decode(
                    &wav(&tone(n, rate, 300.0, 0.5), 1, rate, 16, false),
                    None,
                    &AudioLimits::default(),
                )?;
                let want = (n as u64 * 16_000).div_ceil(u64::from(rate)) as usize;
                assert_eq!(audio.samples.len(), want, "{n} frames at {rate} Hz");
            }
        }
        Ok(())
    }

    /// Resampling keeps a tone's frequency and level, with no delay: a
    /// 1 kHz tone at 44.1 kHz matches the same tone generated at 16 kHz.
    #[test]
    fn resampling_keeps_the_tone() -> TestResult {
        for rate in [8_000u32, 22_050, 44_100, 48_000] {
            let n = rate as usize; // 1 s
            let audio = decode(
                &wav(&tone(n, rate, 1000.0, 0.5), 1, rate, 32, true),
                None,
                &AudioLimits::default(),
            )?;
            assert_eq!(audio.samples.len(), 16_000, "{rate} Hz");
            let want = tone(16_000, 16_000, 1000.0, 0.5);
            // Away from the edges, where the resampler sees the cut.
            let worst = audio.samples[400..15_600]
                .iter()
                .zip(&want[400..15_600])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 5e-3, "{rate} Hz: {worst}");
        }
        Ok(())
    }

    /// A WAV of unknown length (sizes 0xFFFFFFFF, as ffmpeg writes to a
    /// pipe) decodes to its end, a stray byte after the last sample
    /// included; one cut to half its declared length is truncated.
    #[test]
    fn wav_lengths() -> TestResult {
        let limits = AudioLimits::default();
        let mut streamed = wav(&tone(1000, 16_000, 440.0, 0.5), 1, 16_000, 16, false);
        streamed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        streamed[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&streamed, None, &limits)?.samples.len(), 1000);
        streamed.push(7);
        assert_eq!(decode(&streamed, None, &limits)?.samples.len(), 1000);
        let mut short = wav(&tone(16_000, 16_000, 440.0, 0.5), 1, 16_000, 16, false);
        short[4..8].copy_from_slice(&(36 + 64_000u32).to_le_bytes());
        short[40..44].copy_from_slice(&64_000u32.to_le_bytes());
        match decode(&short, None, &limits) {
            Err(AudioError::Truncated { decoded_s, .. }) => assert!((decoded_s - 1.0).abs() < 0.01),
            other => return Err(format!("{other:?}").into()),
        }
        Ok(())
    }

    /// `bytes` with `len` bytes from `at` (a fraction of the length)
    /// scrambled.
    fn scramble(mut bytes: Vec<u8>, at: f64, len: usize) -> Vec<u8> {
        let start = (bytes.len() as f64 * at) as usize;
        let end = (start + len).min(bytes.len());
        for (i, b) in bytes[start..end].iter_mut().enumerate() {
            *b ^= (i as u8).wrapping_mul(37) | 1;
        }
        bytes
    }

    /// A few damaged packets are skipped and counted; many fail the file;
    /// a damaged Ogg page fails it.
    #[test]
    fn damaged_packets() -> TestResult {
        let limits = AudioLimits::default();
        let flac = decode(&scramble(fixture("speech.flac")?, 0.5, 40), None, &limits)?;
        assert_eq!(flac.skipped_packets, 1);
        assert!(
            flac.duration_s < 1.45 && flac.duration_s > 1.2,
            "{}",
            flac.duration_s
        );
        let m4a = decode(&scramble(fixture("speech.m4a")?, 0.5, 40), None, &limits)?;
        assert!((1..=MAX_BAD_PACKETS).contains(&m4a.skipped_packets));
        assert!(matches!(
            decode(&scramble(fixture("speech.m4a")?, 0.3, 4000), None, &limits),
            Err(AudioError::TooManyBadPackets { .. })
        ));
        assert!(matches!(
            decode(&scramble(fixture("speech.ogg")?, 0.5, 40), None, &limits),
            Err(AudioError::Corrupt(_))
        ));
        Ok(())
    }

    #[test]
    fn limits_trigger() -> TestResult {
        let bytes = fixture("speech.mp3")?;
        let small = AudioLimits {
            max_bytes: bytes.len() - 1,
            ..AudioLimits::default()
        };
        assert!(matches!(
            decode(&bytes, Some("mp3"), &small),
            Err(AudioError::TooLarge { .. })
        ));
        let short = AudioLimits {
            max_seconds: 0.5,
            ..AudioLimits::default()
        };
        for name in [
            "speech.mp3",
            "speech.flac",
            "speech_16k_mono.wav",
            "speech.ogg",
            "speech.m4a",
        ] {
            match decode(&fixture(name)?, None, &short) {
                Err(AudioError::TooLong { seconds, limit_s }) => {
                    assert_eq!(limit_s, 0.5);
                    assert!(seconds > 0.5 && seconds < 1.6, "{name}: {seconds}");
                }
                other => return Err(format!("{name}: {other:?}").into()),
            }
        }
        Ok(())
    }

    #[test]
    fn damaged_input_is_an_error() -> TestResult {
        let limits = AudioLimits::default();
        assert_eq!(decode(&[], None, &limits), Err(AudioError::EmptyFile));
        let garbage: Vec<u8> = (0..4000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert!(matches!(
            decode(&garbage, None, &limits),
            Err(AudioError::UnsupportedFormat(_))
        ));
        // A header with no samples.
        let empty_wav = wav(&[], 1, 16_000, 16, false);
        assert_eq!(
            decode(&empty_wav, Some("wav"), &limits),
            Err(AudioError::Empty)
        );
        // A sample rate no recorder uses.
        let odd = wav(&tone(100, 16_000, 440.0, 0.5), 1, 10, 16, false);
        assert!(matches!(
            decode(&odd, Some("wav"), &limits),
            Err(AudioError::UnsupportedStream(_))
        ));
        for name in [
            "speech.flac",
            "speech.mp3",
            "speech.ogg",
            "speech.m4a",
            "speech.aac",
            "speech_44k_stereo.wav",
        ] {
            let bytes = fixture(name)?;
            // Cut inside the header.
            let head = decode(&bytes[..30], None, &limits);
            assert!(head.is_err(), "{name}: header only decoded: {head:?}");
            // Cut in the middle: an error that says so, or (lengths that
            // are only estimates) the part before the cut.
            let half = decode(&bytes[..bytes.len() / 2], None, &limits);
            match (name, half) {
                (
                    "speech.flac" | "speech_44k_stereo.wav",
                    Err(AudioError::Truncated { decoded_s, .. }),
                ) => {
                    assert!(decoded_s > 0.1, "{name}: {decoded_s}");
                }
                ("speech.ogg", Err(AudioError::Truncated { decoded_s, .. })) => {
                    assert_eq!(decoded_s, 0.0)
                }
                ("speech.m4a", Err(AudioError::UnsupportedFormat(m))) => {
                    assert!(m.contains("moov"), "{m}")
                }
                ("speech.mp3" | "speech.aac", Ok(audio)) => {
                    assert!(
                        (0.5..1.0).contains(&audio.duration_s),
                        "{name}: {}",
                        audio.duration_s
                    );
                }
                (_, other) => return Err(format!("{name} cut in half: {other:?}").into()),
            }
        }
        Ok(())
    }
}
