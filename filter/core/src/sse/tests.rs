use serde_json::json;

use super::*;
use crate::dialect::chat::stream::tests::parses;
use crate::dialect::chat::stream::Chat;
use crate::dialect::AnyGrammar;
use crate::dialect::Dialect;

const STREAM: &str =
    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

/// The stream read from `pieces`, none of them the last.
fn scan(pieces: &[&[u8]]) -> Stream<Chat> {
    let mut s = Stream::new();
    for p in pieces {
        s.feed(p, false, None);
        assert!(s.reader.pending() <= MAX_EVENT);
    }
    s
}

/// The bytes a stripping stream passes on for `chunk`.
fn pass(s: &mut Stream<Chat>, chunk: &[u8], end: bool) -> Vec<u8> {
    s.feed(chunk, end, None).unwrap_or_else(|| chunk.to_vec())
}

fn stripping() -> Stream<Chat> {
    let mut s = Stream::new();
    s.strip_usage();
    s
}

#[test]
fn scans_a_stream_split_anywhere() {
    for split in 1..STREAM.len() {
        let (a, b) = STREAM.as_bytes().split_at(split);
        let s = scan(&[a, b]);
        let g = s.grammar();
        assert_eq!(
            g.usage(),
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 2,
                cached_tokens: 0,
                ..Usage::default()
            }),
            "split at {split}"
        );
        assert!(g.finished() && g.ended());
        assert_eq!(s.events(), 5);
    }
}

#[test]
fn crlf_and_no_space_after_colon() {
    let mut s = Stream::<Chat>::new();
    s.feed(
        b"data:{\"choices\":[{\"finish_reason\":\"length\"}]}\r\n\r\ndata:[DONE]\r\n",
        true,
        None,
    );
    assert!(s.grammar().finished() && s.grammar().ended());
    assert_eq!(s.usage(), None);
}

#[test]
fn unfinished_stream_is_not_done() {
    let s = scan(&[b"data: {\"choices\":[{\"finish_reason\":null}]}\n\ndata: [DO"]);
    assert!(!s.grammar().finished() && !s.grammar().ended());
    let mut s = s;
    s.feed(b"", true, None);
    assert!(!s.grammar().ended(), "`[DO` is not the end");
}

#[test]
fn overlong_line_is_skipped_with_bounded_memory() {
    let mut s = Stream::<Chat>::new();
    s.feed(b"data: ", false, None);
    for _ in 0..10 {
        s.feed(&vec![b'x'; MAX_EVENT / 4], false, None);
    }
    assert!(s.reader.pending() <= MAX_EVENT);
    s.feed(b"\n\ndata: [DONE]\n\n", false, None);
    assert!(s.grammar().ended());
}

#[test]
fn the_usage_only_chunk_is_removed_wherever_the_stream_splits() {
    let without: String = STREAM
        .split_inclusive("\n\n")
        .filter(|e| !e.contains("\"choices\":[]"))
        .collect();
    assert_eq!(without.len() + 72, STREAM.len());
    for split in 0..=STREAM.len() {
        for second in [split, (split + 37).min(STREAM.len())] {
            let mut strip = stripping();
            let b = STREAM.as_bytes();
            let mut out = pass(&mut strip, &b[..split], false);
            out.extend(pass(&mut strip, &b[split..second], false));
            out.extend(pass(&mut strip, &b[second..], true));
            assert_eq!(String::from_utf8(out).unwrap(), without, "{split} {second}");
            assert_eq!(strip.removed(), 1);
            // The usage is read all the same, in the same pass.
            assert_eq!(strip.usage().map(|u| u.prompt_tokens), Some(9));
        }
    }
}

#[test]
fn other_events_pass_as_they_are() {
    for stream in [
        "data: {\"choices\":[],\"usage\":null}\n\n",
        "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1}}\n\n",
        ": comment\r\n\r\ndata: [DONE]\r\n\r\n",
        "event: x\ndata: {\"choices\":[]}\ndata: {}\n\n",
        "data: {\"choices\":[],\"usage\":{}}",
    ] {
        let mut strip = stripping();
        assert_eq!(
            pass(&mut strip, stream.as_bytes(), true),
            stream.as_bytes(),
            "{stream}"
        );
    }
    // CRLF events are recognised too.
    let mut strip = stripping();
    let crlf = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: [DONE]\r\n\r\n";
    assert_eq!(
        pass(&mut strip, crlf.as_bytes(), false),
        b"data: [DONE]\r\n\r\n"
    );
    // Without the strip, nothing is ever put in place of the bytes.
    let mut plain = Stream::<Chat>::new();
    assert_eq!(plain.feed(crlf.as_bytes(), true, None), None);
}

#[test]
fn an_endless_event_is_let_through() {
    let mut strip = stripping();
    let big = vec![b'x'; MAX_HELD_EVENT + 1];
    assert!(pass(&mut strip, b"data: ", false).is_empty());
    let out = pass(&mut strip, &big, false);
    assert_eq!(out.len(), big.len() + 6);
    assert_eq!(pass(&mut strip, b"\n\n", false), b"\n\n");
}

/// A collector that records what it is given.
#[derive(Debug, Default)]
struct Record {
    limit: usize,
    gave_up: bool,
    got: Vec<String>,
}

impl Collect for Record {
    fn limit(&self) -> usize {
        self.limit
    }
    fn wants(&self) -> bool {
        !self.gave_up
    }
    fn take(&mut self, piece: Piece) {
        self.gave_up |= matches!(piece, Piece::TooLarge);
        self.got.push(match piece {
            Piece::Chunk(v) => v.to_string(),
            other => format!("{other:?}"),
        });
    }
}

#[test]
fn each_event_is_parsed_once_for_usage_strip_and_collector() {
    let mut s = stripping();
    let mut rec = Record {
        limit: 4096,
        ..Record::default()
    };
    let before = parses();
    let mut out = Vec::new();
    for b in STREAM.as_bytes().chunks(7) {
        out.extend(
            s.feed(b, false, Some(&mut rec))
                .unwrap_or_else(|| b.to_vec()),
        );
    }
    out.extend(s.feed(b"", true, Some(&mut rec)).unwrap_or_default());
    // Four JSON chunks, four parses: `[DONE]` needs none.
    assert_eq!(parses() - before, 4);
    assert_eq!(rec.got.len(), 5);
    assert_eq!(
        rec.got[3],
        json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}).to_string()
    );
    assert_eq!(rec.got[4], "End");
    assert_eq!(s.removed(), 1);
    assert_eq!(s.usage().map(|u| u.completion_tokens), Some(2));
    assert_eq!(out.len() + 72, STREAM.len());
}

#[test]
fn the_collector_gets_the_answer_and_nothing_after_it() {
    let mut rec = Record {
        limit: 64,
        ..Record::default()
    };
    let mut s = Stream::<Chat>::new();
    s.feed(
        b": ping\n\ndata: {\"a\":1}\n\ndata: {nope\n\ndata: [DONE]\n\ndata: {\"late\":1}\n\n",
        false,
        Some(&mut rec),
    );
    assert_eq!(rec.got, ["{\"a\":1}", "NotJson", "End"]);
    // An event longer than the collector takes, whole or under way.
    for (stream, end) in [
        (format!("data: {}\n\n", "x".repeat(65)), false),
        (format!("data: {}", "x".repeat(65)), false),
        (format!("data: {}", "x".repeat(65)), true),
    ] {
        let mut rec = Record {
            limit: 64,
            ..Record::default()
        };
        let before = parses();
        let mut s = Stream::<Chat>::new();
        s.feed(stream.as_bytes(), end, Some(&mut rec));
        assert_eq!(rec.got, ["TooLarge"], "{stream}");
        assert!(
            parses() - before <= 1,
            "the usage reading may still parse it"
        );
        // Once given up, the collector is left alone.
        s.feed(b"data: {}\n\n", true, Some(&mut rec));
        assert_eq!(rec.got.len(), 1);
    }
    // A collector raises the reader's bound to its limit.
    let mut rec = Record {
        limit: MAX_EVENT * 2,
        ..Record::default()
    };
    let big = format!("data: {{\"s\":\"{}\"}}\n\n", "y".repeat(MAX_EVENT));
    let mut s = Stream::<Chat>::new();
    s.feed(big.as_bytes(), false, Some(&mut rec));
    assert_eq!(rec.got.len(), 1);
    assert!(rec.got[0].len() > MAX_EVENT);
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    fn event() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..1_000_000, 0u64..1_000_000).prop_map(|(p, c)| format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}}}}\n\n"
            )),
            fuzz::text().prop_map(|t| format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]}}\r\n\r\n",
                serde_json::to_string(&t).unwrap()
            )),
            Just("data:{\"choices\":[{\"finish_reason\":\"stop\"}]}\n\n".to_string()),
            Just(": ping\n\nevent: x\nid: 1\n\n".to_string()),
            fuzz::text().prop_map(|t| format!("data: {}\n\n", t.replace('\n', " "))),
        ]
    }

    fn summary(chunks: &[&[u8]]) -> (Option<Usage>, bool, bool, u64) {
        let s = scan(chunks);
        let g = s.grammar();
        (g.usage(), g.finished(), g.ended(), s.events())
    }

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// However the stream is cut, the reading gives the same usage,
        /// finish, end and event count as from one piece, and the strip the
        /// same bytes.
        #[test]
        fn cutting_the_stream_changes_nothing(events in prop::collection::vec(event(), 0..8), done: bool, cuts in prop::collection::vec(any::<usize>(), 0..8)) {
            let mut stream = events.concat();
            if done {
                stream.push_str("data: [DONE]\n\n");
            }
            let bytes = stream.as_bytes();
            let whole = summary(&[bytes]);
            prop_assert_eq!(whole.2, done);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                pieces.push(&bytes[from..c]);
                from = c;
            }
            prop_assert_eq!(summary(&pieces), whole);
            let mut strip = stripping();
            let whole_out = pass(&mut strip, bytes, true);
            let mut strip = stripping();
            let mut out = Vec::new();
            for (i, p) in pieces.iter().enumerate() {
                out.extend(pass(&mut strip, p, i + 1 == pieces.len()));
            }
            prop_assert_eq!(out, whole_out);
        }

        /// Endless input without a newline, fed in any sizes, keeps the
        /// buffer within one event; the stream after it is still read.
        #[test]
        fn endless_lines_keep_memory_bounded(sizes in prop::collection::vec(1usize..200_000, 1..24), byte in 0u8..255) {
            let byte = if byte == b'\n' { b'x' } else { byte };
            let mut s = Stream::<Chat>::new();
            s.feed(b"data: ", false, None);
            for n in sizes {
                s.feed(&vec![byte; n], false, None);
                prop_assert!(s.reader.pending() <= MAX_EVENT);
                prop_assert!(s.reader.held_capacity() <= 2 * MAX_EVENT);
            }
            s.feed(b"\n\ndata: [DONE]\n\n", false, None);
            prop_assert!(s.grammar().ended());
        }

        /// Arbitrary bytes, stripped or not, with a collector or not: no panic.
        #[test]
        fn any_bytes_scan(bytes in prop::collection::vec(any::<u8>(), 0..512), strip: bool, limit in 0usize..600) {
            let mut s = Stream::<Chat>::new();
            if strip {
                s.strip_usage();
            }
            let mut rec = Record { limit, ..Record::default() };
            s.feed(&bytes, false, Some(&mut rec));
            s.feed(b"", true, Some(&mut rec));
        }
    }
}

/// An OpenAI Responses stream as the API sends it (fields trimmed).
pub(crate) const RESPONSES: &str = "event: response.created\n\
data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_abc\",\"status\":\"in_progress\",\"usage\":null}}\n\n\
event: response.in_progress\n\
data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_abc\"}}\n\n\
event: response.output_text.delta\n\
data: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\"Hi\"}\n\n\
event: response.some_future_event\n\
data: {\"type\":\"response.some_future_event\",\"usage\":{\"input_tokens\":999}}\n\n\
event: response.output_text.done\n\
data: {\"type\":\"response.output_text.done\",\"sequence_number\":3,\"text\":\"Hi\"}\n\n\
event: response.completed\n\
data: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_abc\",\"status\":\"completed\",\"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":3,\"total_tokens\":15}}}\n\n";

/// An Anthropic Messages stream as the API sends it (fields trimmed).
pub(crate) const MESSAGES: &str = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"content\":[],\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":6,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n\
event: content_block_start\n\
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\n\
data: {\"type\": \"ping\"}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
event: content_block_stop\n\
data: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":7}}\n\n\
event: message_stop\n\
data: {\"type\":\"message_stop\"}\n\n";

/// `text` fed to a stream of `dialect`'s grammar, cut at `split`.
fn stream_of(dialect: Dialect, text: &str, split: usize) -> Stream<AnyGrammar> {
    let mut s = Stream::with_grammar(dialect.answer().grammar());
    let (a, b) = text.as_bytes().split_at(split);
    assert_eq!(s.feed(a, false, None), None);
    assert_eq!(s.feed(b, true, None), None);
    s
}

#[test]
fn a_responses_stream_gives_its_final_usage_and_its_id() {
    for split in (1..RESPONSES.len()).step_by(7) {
        let s = stream_of(Dialect::Responses, RESPONSES, split);
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 3,
                cached_tokens: 8,
                ..Usage::default()
            }),
            "split at {split}"
        );
        let AnyGrammar::Responses(g) = s.grammar() else {
            panic!("the Responses grammar");
        };
        assert!(g.finished() && g.ended());
        assert_eq!(g.response_id.as_deref(), Some("resp_abc"));
        assert_eq!(s.events(), 6);
    }
    // Cut short: no final event, no usage, not finished.
    let cut = &RESPONSES[..RESPONSES.find("event: response.completed").unwrap()];
    let s = stream_of(Dialect::Responses, cut, 10);
    assert_eq!(s.usage(), None);
    assert!(!s.grammar().finished() && !s.grammar().ended());
}

#[test]
fn a_messages_stream_adds_its_usage_up_over_its_events() {
    for split in (1..MESSAGES.len()).step_by(5) {
        let s = stream_of(Dialect::Messages, MESSAGES, split);
        // Input: 4 fresh + 6 read from the cache; output as of message_delta.
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 7,
                cached_tokens: 6,
                ..Usage::default()
            }),
            "split at {split}"
        );
        assert!(s.grammar().finished() && s.grammar().ended());
        assert!(matches!(s.grammar(), AnyGrammar::Messages(_)));
        assert_eq!(s.events(), 7);
    }
    // An error event ends the stream unfinished.
    let s = stream_of(
        Dialect::Messages,
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        3,
    );
    assert!(s.grammar().ended() && !s.grammar().finished());
    // Whole only when `message_stop` follows the stop reason: an error in
    // between, or a stop without a reason, leaves it unfinished.
    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let (head, _) = MESSAGES.split_at(MESSAGES.find(stop).unwrap());
    let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"}}\n\n";
    let without_reason = MESSAGES.replace("\"end_turn\"", "null");
    for cut in [
        head.to_string(),
        format!("{head}{error}{stop}"),
        without_reason,
    ] {
        let s = stream_of(Dialect::Messages, &cut, 9);
        assert!(!s.grammar().finished(), "{cut}");
    }
}

#[test]
fn a_strip_removes_nothing_from_a_named_stream() {
    // The usage the filter asks a chat stream for is never asked of these,
    // and their usage events are the client's.
    for (dialect, text) in [
        (Dialect::Messages, MESSAGES),
        (Dialect::Responses, RESPONSES),
    ] {
        let mut s = Stream::with_grammar(dialect.answer().grammar());
        s.strip_usage();
        assert_eq!(s.feed(text.as_bytes(), true, None), None, "{dialect:?}");
        assert_eq!(s.removed(), 0);
    }
}

#[test]
fn each_dialect_says_why_its_stream_ended() {
    let incomplete = RESPONSES.replace(
        "\"status\":\"completed\"",
        "\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}",
    );
    let two_choices = "data: {\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[{\"index\":1,\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
    for (dialect, text, want) in [
        (Dialect::Chat, STREAM, vec!["stop"]),
        (Dialect::Chat, two_choices, vec!["stop", "length"]),
        (Dialect::Responses, RESPONSES, vec!["completed"]),
        (
            Dialect::Responses,
            incomplete.as_str(),
            vec!["max_output_tokens"],
        ),
        (Dialect::Messages, MESSAGES, vec!["end_turn"]),
    ] {
        for split in (1..text.len()).step_by(11) {
            let s = stream_of(dialect, text, split);
            assert_eq!(
                s.grammar().finish_reasons().as_strs(),
                want,
                "{dialect:?} at {split}"
            );
        }
    }
    // A stream cut before its end says nothing.
    let cut = &MESSAGES[..MESSAGES.find("event: message_delta").unwrap()];
    let s = stream_of(Dialect::Messages, cut, 4);
    assert!(s.grammar().finish_reasons().as_strs().is_empty());
}

#[test]
fn finish_reasons_stay_bounded() {
    let mut reasons = FinishReasons::default();
    let long = "é".repeat(100);
    for _ in 0..100 {
        reasons.push(&long);
    }
    reasons.push("");
    let kept = reasons.as_strs();
    assert_eq!(kept.len(), crate::usage::MAX_FINISH_REASONS);
    assert!(kept
        .iter()
        .all(|r| r.len() <= MAX_REASON_BYTES && r.starts_with('é')));
    // A finish_reason that is not a string finishes the choice, saying nothing.
    let mut s = Stream::<Chat>::new();
    s.feed(
        b"data: {\"choices\":[{\"finish_reason\":7}]}\n\n",
        true,
        None,
    );
    assert!(s.grammar().finished());
    assert!(s.grammar().finish_reasons().as_strs().is_empty());
}

#[test]
fn a_state_takes_a_usage_in_as_the_calls_so_far() {
    let usage = |p, c, k| Usage {
        prompt_tokens: p,
        completion_tokens: c,
        cached_tokens: k,
        ..Usage::default()
    };
    let mut state = StreamState::default();
    state.update_usage(usage(4, 0, 6));
    assert_eq!(
        state.usage,
        Some(usage(4, 0, 6)),
        "the first is taken whole"
    );
    state.update_usage(usage(0, 7, 0));
    assert_eq!(state.usage, Some(usage(4, 7, 6)), "a count left out stays");
    state.update_usage(usage(5, 9, 0));
    assert_eq!(state.usage, Some(usage(5, 9, 6)), "a later count replaces");
}
