use super::*;

/// Sample texts (written for these tests) with their token counts under
/// cl100k_base and o200k_base, computed once with OpenAI's `tiktoken` 0.14
/// (`len(encoding.encode(text))`) and written down here: no tokenizer runs in
/// the tests.
const SAMPLES: &[(&str, &str, u64, u64)] = &[
    ("English prose", "The quick brown fox jumps over the lazy dog. Shaping trims the oldest turns of a conversation first, so the newest context always reaches the model. When the prompt is too long for a small model, a routing rule sends it to a larger one instead.", 53, 52),
    ("English chat", "Can you help me write an email to my landlord about the broken heater? It has been cold for three days and nobody answered my calls.", 28, 28),
    ("English instructions", "You are a helpful assistant. Answer in the same language as the question, keep answers short, and cite the documents you used.", 26, 26),
    ("JSON", "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":0.2,\"max_tokens\":256}", 31, 32),
    ("Rust code", "fn main() {\n    let xs: Vec<u64> = (0..10).map(|i| i * 2).collect();\n    println!(\"{:?}\", xs);\n}\n", 37, 37),
    ("French", "Bonjour, pourriez-vous m'aider à écrire une lettre à mon propriétaire concernant le chauffage cassé ? Il fait très froid depuis trois jours.", 36, 27),
    ("Vietnamese", "Hôm nay thời tiết rất đẹp, chúng ta hãy đi dạo trong công viên.", 30, 18),
    ("Chinese", "今天天气很好，我们一起去公园散步吧。人工智能正在改变我们的生活方式，从医疗到教育，各个领域都在发生深刻的变化。请帮我总结一下这篇文章的主要观点，并给出三条改进建议。", 95, 55),
    ("Chinese", "北京是中国的首都，有着三千多年的历史。故宫、长城和天坛都是著名的旅游景点，每年吸引数百万游客。", 56, 37),
    ("Traditional Chinese", "這份報告分析了過去十年間台灣半導體產業的發展趨勢與未來挑戰。", 46, 29),
    ("Japanese", "今日はとても良い天気ですね。明日の会議の資料を準備しなければなりません。このプログラムはエラーが発生したときに自動的に再試行します。", 69, 48),
    ("Japanese kana", "ありがとうございます。またあした、がっこうでおあいしましょう。", 22, 15),
    ("Korean", "안녕하세요, 오늘 날씨가 정말 좋네요. 인공지능 기술은 우리의 삶을 크게 바꾸고 있습니다. 이 문서의 핵심 내용을 요약해 주세요.", 70, 37),
    ("Russian", "Сегодня очень хорошая погода, давайте пойдём гулять в парк. Искусственный интеллект меняет нашу жизнь, от медицины до образования.", 67, 33),
    ("Russian", "Пожалуйста, объясните простыми словами, что такое машинное обучение и где оно применяется.", 40, 20),
    ("Greek", "Σήμερα ο καιρός είναι πολύ καλός. Η τεχνητή νοημοσύνη αλλάζει τη ζωή μας, από την ιατρική έως την εκπαίδευση.", 98, 40),
    ("Arabic", "الطقس جميل جدا اليوم، دعونا نذهب للتنزه في الحديقة. الذكاء الاصطناعي يغير حياتنا من الطب إلى التعليم.", 69, 34),
    ("Hebrew", "מזג האוויר נהדר היום, בואו נלך לטייל בפארק. בינה מלאכותית משנה את חיינו, מרפואה ועד חינוך.", 88, 37),
    ("Hindi", "आज मौसम बहुत अच्छा है, चलो पार्क में टहलने चलते हैं। कृत्रिम बुद्धिमत्ता हमारे जीवन को बदल रही है।", 101, 29),
    ("Hindi", "कृपया मुझे सरल शब्दों में समझाइए कि मशीन लर्निंग क्या है और इसका उपयोग कहाँ होता है।", 86, 26),
    ("Thai", "วันนี้อากาศดีมาก ไปเดินเล่นที่สวนสาธารณะกันเถอะ ปัญญาประดิษฐ์กำลังเปลี่ยนแปลงชีวิตของเรา", 88, 38),
    ("Emoji", "Great job 🎉🎉 see you soon 👋😀", 15, 12),
    ("Mixed Chinese and JSON", "请把下面的 JSON 翻译成中文：{\"title\": \"Quarterly report\", \"pages\": 12}。谢谢！", 36, 28),
];

/// The estimate's ratio to a reference count.
fn ratio(estimate: u64, reference: u64) -> f64 {
    estimate as f64 / reference as f64
}

#[test]
fn every_script_is_within_the_calibration_bounds_of_both_encodings() {
    for (name, text, cl100k, o200k) in SAMPLES {
        let e = estimate(text);
        for (encoding, reference) in [("cl100k", *cl100k), ("o200k", *o200k)] {
            let r = ratio(e, reference);
            assert!(
                (Ratio::MIN.as_f64()..=Ratio::MAX.as_f64()).contains(&(1.0 / r)),
                "{name}: estimate {e}, {encoding} {reference}"
            );
        }
        // Nearer their geometric mean than either bound.
        let mean = ((*cl100k * *o200k) as f64).sqrt();
        let r = ratio(e, mean.round() as u64);
        assert!(
            (0.7..=1.45).contains(&r),
            "{name}: estimate {e}, mean {mean:.0}"
        );
    }
}

#[test]
fn chinese_is_no_longer_a_quarter_token_a_character() {
    let (_, text, cl100k, o200k) = SAMPLES[7];
    let chars = text.chars().count() as u64;
    let quarter = chars.div_ceil(4);
    let e = estimate(text);
    // A quarter per character undercounts it 3 to 4 times under cl100k.
    assert!(ratio(cl100k, quarter) > 3.0);
    assert!(e >= o200k && e <= cl100k, "{e}");
    assert!(ratio(e, quarter) >= 3.5);
}

#[test]
fn english_keeps_a_quarter_a_letter() {
    // Letters and spaces weigh what they did; so does prose made of them.
    assert_eq!(estimate("abcd"), 1);
    assert_eq!(estimate("abcdefgh"), 2);
    assert_eq!(estimate("be brief"), 2);
    assert_eq!(estimate("a b"), 1);
    let (_, prose, cl100k, o200k) = SAMPLES[0];
    let quarter = (prose.chars().count() as u64).div_ceil(4);
    assert!(
        estimate(prose) <= quarter + quarter / 10,
        "{}",
        estimate(prose)
    );
    assert!(estimate(prose) >= cl100k.max(o200k));
    // Digits and punctuation count for more than a quarter.
    assert_eq!(estimate("12345678"), 4);
    assert_eq!(estimate("{}"), 1);
    assert_eq!(estimate(""), 0);
}

#[test]
fn each_class_has_its_weight() {
    use weight::*;
    for (c, w) in [
        ('a', LATIN),
        ('Z', LATIN),
        ('7', DIGIT),
        (' ', SPACE),
        ('\n', SPACE),
        ('\u{3000}', SPACE),
        ('\u{a0}', SPACE),
        ('{', PUNCTUATION),
        ('—', PUNCTUATION),
        ('¿', PUNCTUATION),
        ('é', LATIN_EXTENDED),
        ('ệ', LATIN_EXTENDED),
        ('中', HAN),
        ('。', HAN),
        ('，', HAN),
        ('𠀀', HAN),
        ('か', KANA),
        ('カ', KANA),
        ('한', HANGUL),
        ('ж', CYRILLIC),
        ('λ', GREEK),
        ('ش', ARABIC),
        ('ש', HEBREW),
        ('क', INDIC),
        ('த', INDIC),
        ('ก', SOUTHEAST_ASIAN),
        ('🎉', EMOJI),
        ('\u{200d}', EMOJI),
        ('\u{fe0f}', EMOJI),
        ('☀', EMOJI),
        ('∑', OTHER),
        ('ሰ', OTHER),
        ('\u{e000}', OTHER),
    ] {
        assert_eq!(char_weight(c), w, "{c:?}");
    }
}

#[test]
fn sums_round_once_and_never_overflow() {
    assert_eq!(tokens(0), 0);
    assert_eq!(tokens(1), 1);
    assert_eq!(tokens(1000), 1);
    assert_eq!(tokens(1001), 2);
    assert_eq!(tokens(u64::MAX), u64::MAX.div_ceil(1000));
    // Three letters weigh 0.75, four one token: a text rounds as a whole.
    assert_eq!(milli_tokens("abc"), 750);
    assert_eq!(estimate("中a"), 2);
}
