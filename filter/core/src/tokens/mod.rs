//! How many tokens a text is, estimated without a tokenizer: every character
//! is weighed by its script, since a tokenizer spends about a token on a
//! Chinese character where it spends a quarter of one on an English letter
//! (a flat quarter per character undercounts Chinese three to four times).
//! Each model's real ratio to this estimate is learnt from the usage its
//! provider reports ([`calibration`]).
//!
//! ```text
//! tokens(text) = ⌈ Σ_class weight(class) × chars(class) ⌉   (weights in thousandths)
//! calibrated   = ⌈ tokens × ratio(model) ⌉,  ratio ∈ [0.5, 2.0], 1 until learnt
//! ```
//!
//! The weights sit between the two public OpenAI encodings, cl100k_base
//! (GPT-4, GPT-3.5, most open models' behaviour) and o200k_base (GPT-4o and
//! later), measured with `tiktoken` on sample texts of each script: where the
//! two differ, the weight is their geometric mean, so the ratio of either
//! stays within the calibration's bounds. Claude's tokenizer is not public:
//! its ratio is what the calibration learns from the `input_tokens` it
//! reports. English keeps the quarter per letter and space it always had
//! (about 15% above both encodings on prose; the calibration takes that out).

pub mod calibration;

pub use calibration::Ratio;

/// Thousandths of a token per character, by class; see each constant for the
/// measure it comes from (tokens per character of the class, with the
/// spaces and punctuation of the sample counted at their own weights,
/// cl100k_base / o200k_base).
pub mod weight {
    /// ASCII letters: today's quarter, kept so English estimates keep their
    /// meaning (fitted on English prose, chat and code: 0.14 a letter plus
    /// 0.5 a space, the same total on prose).
    pub const LATIN: u64 = 250;
    /// ASCII whitespace and any other Unicode whitespace: as letters (see
    /// [`LATIN`]; a run of indentation is one token, a space before a word
    /// none).
    pub const SPACE: u64 = 250;
    /// ASCII digits: both encodings cut numbers into groups of at most three
    /// digits (fitted 0.48 / 0.49).
    pub const DIGIT: u64 = 500;
    /// ASCII punctuation and symbols, Latin-1 and general punctuation: most
    /// stand alone in code and JSON (fitted 0.60 / 0.62).
    pub const PUNCTUATION: u64 = 500;
    /// Latin letters beyond ASCII (accented, Vietnamese, Polish): an accent
    /// often splits its word (1.27 / 0.76).
    pub const LATIN_EXTENDED: u64 = 1000;
    /// CJK ideographs, CJK symbols and punctuation, fullwidth forms: Chinese
    /// samples 1.28 / 0.79, Japanese kanji with kana 1.15 / 0.65.
    pub const HAN: u64 = 1000;
    /// Hiragana and katakana (0.84 / 0.57).
    pub const KANA: u64 = 700;
    /// Hangul syllables and jamo (1.14 / 0.65).
    pub const HANGUL: u64 = 850;
    /// Cyrillic (0.51 / 0.20).
    pub const CYRILLIC: u64 = 320;
    /// Greek and Coptic, extended Greek (0.97 / 0.36).
    pub const GREEK: u64 = 600;
    /// Arabic, its supplement and presentation forms (0.82 / 0.33).
    pub const ARABIC: u64 = 520;
    /// Hebrew (1.08 / 0.39).
    pub const HEBREW: u64 = 650;
    /// Devanagari and the other Indic scripts, measured on Hindi (1.19 / 0.34).
    pub const INDIC: u64 = 630;
    /// Thai, Lao, Khmer, Myanmar, measured on Thai (0.96 / 0.38).
    pub const SOUTHEAST_ASIAN: u64 = 600;
    /// Emoji and their joiners and selectors, per code point (2.88 / 1.71):
    /// a tokenizer that knows none spends their UTF-8 bytes.
    pub const EMOJI: u64 = 2200;
    /// Everything else (other scripts, symbols, private use): about the
    /// token a rare character costs when its bytes are not merged further.
    pub const OTHER: u64 = 1000;
}

/// The weight of one character, in thousandths of a token.
pub fn char_weight(c: char) -> u64 {
    use weight::*;
    let cp = u32::from(c);
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            LATIN
        } else if c.is_ascii_digit() {
            DIGIT
        } else if c.is_ascii_whitespace() {
            SPACE
        } else {
            PUNCTUATION
        };
    }
    if c.is_whitespace() {
        return SPACE;
    }
    match cp {
        0x200D => EMOJI,
        0x00A1..=0x00BF | 0x00D7 | 0x00F7 | 0x2000..=0x206F => PUNCTUATION,
        0x00C0..=0x024F | 0x1E00..=0x1EFF | 0x0300..=0x036F => LATIN_EXTENDED,
        0x0370..=0x03FF | 0x1F00..=0x1FFF => GREEK,
        0x0400..=0x052F | 0x1C80..=0x1C8F | 0x2DE0..=0x2DFF | 0xA640..=0xA69F => CYRILLIC,
        0x0590..=0x05FF | 0xFB1D..=0xFB4F => HEBREW,
        0x0600..=0x06FF | 0x0750..=0x077F | 0x08A0..=0x08FF | 0xFB50..=0xFDFF | 0xFE70..=0xFEFF => {
            ARABIC
        }
        0x0900..=0x0DFF => INDIC,
        0x0E00..=0x0EFF | 0x1000..=0x109F | 0x1780..=0x17FF => SOUTHEAST_ASIAN,
        0x1100..=0x11FF | 0x3130..=0x318F | 0xA960..=0xA97F | 0xAC00..=0xD7FF => HANGUL,
        0x3040..=0x30FF | 0x31F0..=0x31FF | 0xFF66..=0xFF9F => KANA,
        0x2E80..=0x2FDF
        | 0x3000..=0x303F
        | 0x3190..=0x31EF
        | 0x3200..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xF900..=0xFAFF
        | 0xFF00..=0xFF65
        | 0xFFE0..=0xFFEF
        | 0x20000..=0x3FFFF => HAN,
        0x1F000..=0x1FAFF | 0x2600..=0x27BF | 0xFE00..=0xFE0F | 0xE0020..=0xE007F => EMOJI,
        _ => OTHER,
    }
}

/// The weight of a text, in thousandths of a token: one pass over its
/// characters. Sums of several texts round once, at the end ([`tokens`]).
pub fn milli_tokens(text: &str) -> u64 {
    text.chars()
        .fold(0u64, |sum, c| sum.saturating_add(char_weight(c)))
}

/// The estimated tokens of a weight in thousandths, rounded up.
pub fn tokens(milli: u64) -> u64 {
    milli.div_ceil(1000)
}

/// The estimated tokens of one text.
pub fn estimate(text: &str) -> u64 {
    tokens(milli_tokens(text))
}

#[cfg(test)]
mod tests;
