//! Splits a server-sent-event stream into its events as the bytes pass, in
//! whatever pieces they come: the one line and event splitter of the filter.
//! Lines end at `\n` (a `\r` before it is dropped), a blank line ends an
//! event, `data:` lines join with `\n`, `event:` names the event, comments
//! and the other fields (`id`, `retry`) carry nothing the filter reads.

/// The field of an event's payload.
pub(crate) const DATA_FIELD: &[u8] = b"data";
/// The field that names an event's type.
pub(crate) const EVENT_FIELD: &[u8] = b"event";
/// What ends an event when the filter writes one.
pub(crate) const EVENT_END: &[u8] = b"\n\n";

/// Most bytes of one event (its data, its type and the line under way) the
/// reader holds unless a collector needs more; a longer event is skipped to
/// its end and reported as [`Event::oversize`].
pub const MAX_EVENT: usize = 256 * 1024;

/// One event of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The `event:` field, when the stream names its events.
    pub kind: Option<&'a [u8]>,
    /// The `data:` lines joined by `\n`; `None` when the event had none
    /// (a comment, a keep-alive, a blank line of its own).
    pub data: Option<&'a [u8]>,
    /// The event was longer than the reader holds: what it said is lost.
    pub oversize: bool,
    /// Where the event ended in the piece just fed: the offset past its
    /// blank line; `None` for the unterminated event the stream's end flushes.
    pub end: Option<usize>,
}

/// The incremental reader: holds the line under way and the event so far,
/// never more than its bound. An event is too long when its data and type
/// so far and any one of its lines exceed the bound; the test is the same
/// however the stream is cut.
#[derive(Debug)]
pub struct Reader {
    bound: usize,
    /// The start of the line the last piece ended in, without the `\r`s it
    /// ended with (counted in `cr`: they are its end, or content if more follows).
    line: Vec<u8>,
    cr: usize,
    /// The line under way outgrew the bound: it is skipped to its end.
    line_dropped: bool,
    data: Vec<u8>,
    has_data: bool,
    kind: Option<Vec<u8>>,
    /// The event under way outgrew the bound: its lines are skipped to its end.
    oversize: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Self::new(MAX_EVENT)
    }
}

impl Reader {
    /// A reader at the start of a stream, holding at most `bound` bytes.
    pub fn new(bound: usize) -> Self {
        Self {
            bound,
            line: Vec::new(),
            cr: 0,
            line_dropped: false,
            data: Vec::new(),
            has_data: false,
            kind: None,
            oversize: false,
        }
    }

    /// Changes the bound from the next byte on.
    pub fn set_bound(&mut self, bound: usize) {
        self.bound = bound;
    }

    /// Bytes held for the event under way.
    pub fn pending(&self) -> usize {
        self.line
            .len()
            .saturating_add(self.data.len())
            .saturating_add(self.kind.as_ref().map_or(0, Vec::len))
    }

    /// The capacity of the line buffer, to check memory stays bounded.
    #[cfg(test)]
    pub(crate) fn held_capacity(&self) -> usize {
        self.line.capacity().max(self.data.capacity())
    }

    /// Reads the next piece of the stream, calling `on` for every event
    /// (every blank line) it completes.
    pub fn feed(&mut self, bytes: &[u8], on: &mut dyn FnMut(Event<'_>)) {
        let mut at = 0;
        for part in bytes.split_inclusive(|b| *b == b'\n') {
            at += part.len();
            if part.last() != Some(&b'\n') {
                // The piece ends inside a line: keep its start.
                self.hold(part);
                continue;
            }
            let content = trim_eol(part);
            if self.line.is_empty() && self.cr == 0 && !self.line_dropped {
                self.line_done(content, Some(at), on);
                continue;
            }
            if !content.is_empty() {
                self.hold(content);
            }
            self.cr = 0;
            let dropped = std::mem::take(&mut self.line_dropped);
            let line = std::mem::take(&mut self.line);
            if !dropped {
                self.line_done(&line, Some(at), on);
            }
            self.line = line;
            self.line.clear();
        }
    }

    /// The stream ended: an event it left without its blank line counts
    /// still. The reader is then at the start of a stream again.
    pub fn finish(&mut self, on: &mut dyn FnMut(Event<'_>)) {
        self.cr = 0;
        if std::mem::take(&mut self.line_dropped) {
            self.oversize = true;
        } else if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, None, on);
        }
        if self.has_data || self.oversize {
            self.dispatch(None, on);
        }
        self.kind = None;
    }

    /// Keeps the start of a line (`part` holds no `\n`), or drops it and its
    /// event past the bound.
    fn hold(&mut self, part: &[u8]) {
        if self.line_dropped {
            return;
        }
        let content = trim_eol(part);
        if content.is_empty() {
            self.cr = self.cr.saturating_add(part.len());
            return;
        }
        if self.oversize {
            // Nothing of the event is read any more: only its end matters.
            self.line_dropped = true;
            return;
        }
        let grown = self
            .pending()
            .saturating_add(self.cr)
            .saturating_add(content.len());
        if grown > self.bound {
            self.line = Vec::new();
            self.cr = 0;
            self.line_dropped = true;
            self.drop_event();
            return;
        }
        // The `\r`s held back are content: more of the line follows them.
        self.line
            .resize(self.line.len().saturating_add(self.cr), b'\r');
        self.line.extend_from_slice(content);
        self.cr = part.len().saturating_sub(content.len());
    }

    /// A complete line, without its end.
    fn line_done(&mut self, line: &[u8], end: Option<usize>, on: &mut dyn FnMut(Event<'_>)) {
        if line.is_empty() {
            self.dispatch(end, on);
            return;
        }
        if self.oversize {
            return;
        }
        if self.pending().saturating_add(line.len()) > self.bound {
            self.drop_event();
            return;
        }
        // A line without a colon, and comments (an empty field name), say
        // nothing read here; neither do `id` and `retry`.
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return;
        };
        let (name, value) = line.split_at(colon);
        let value = value.get(1..).unwrap_or_default();
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if name == DATA_FIELD {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        } else if name == EVENT_FIELD {
            let kind = self.kind.get_or_insert_with(Vec::new);
            kind.clear();
            kind.extend_from_slice(value);
        }
    }

    /// Forgets what the event under way said: it is too long to hold.
    fn drop_event(&mut self) {
        self.oversize = true;
        self.data = Vec::new();
        self.has_data = false;
        self.kind = None;
    }

    fn dispatch(&mut self, end: Option<usize>, on: &mut dyn FnMut(Event<'_>)) {
        let oversize = std::mem::take(&mut self.oversize);
        on(Event {
            kind: self.kind.as_deref(),
            data: self.has_data.then_some(self.data.as_slice()),
            oversize,
            end,
        });
        self.data.clear();
        self.has_data = false;
        self.kind = None;
    }
}

/// The line without its end (`\n`, and any `\r` before it).
fn trim_eol(mut line: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r'] = line {
        line = rest;
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event as owned values, to compare.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Owned {
        kind: Option<String>,
        data: Option<String>,
        oversize: bool,
        end: Option<usize>,
    }

    fn owned(e: Event<'_>) -> Owned {
        let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        Owned {
            kind: e.kind.map(s),
            data: e.data.map(s),
            oversize: e.oversize,
            end: e.end,
        }
    }

    /// Every event of `pieces` fed in turn, then the end; `end` offsets made
    /// absolute in the whole stream.
    fn read(reader: &mut Reader, pieces: &[&[u8]]) -> Vec<Owned> {
        let mut out = Vec::new();
        let mut base = 0;
        for p in pieces {
            reader.feed(p, &mut |e| {
                let mut e = owned(e);
                e.end = e.end.map(|at| at + base);
                out.push(e);
            });
            base += p.len();
        }
        reader.finish(&mut |e| out.push(owned(e)));
        out
    }

    fn ev(kind: Option<&str>, data: Option<&str>, end: Option<usize>) -> Owned {
        Owned {
            kind: kind.map(String::from),
            data: data.map(String::from),
            oversize: false,
            end,
        }
    }

    const TYPED: &str = ": hello\n\nevent: message_start\ndata: {\"a\":1}\n\n\
id: 7\nretry: 10\nevent: delta\r\ndata:{\"b\":\r\ndata: 2}\r\n\r\n\
event: ping\n\ndata: [DONE]\n\ndata\nevent:x\nfield-without-colon\n\n";

    fn typed_events() -> Vec<Owned> {
        let at = |s: &str| Some(TYPED.find(s).unwrap() + s.len());
        vec![
            ev(None, None, at(": hello\n\n")),
            ev(
                Some("message_start"),
                Some("{\"a\":1}"),
                at("{\"a\":1}\n\n"),
            ),
            ev(Some("delta"), Some("{\"b\":\n2}"), at("2}\r\n\r\n")),
            ev(Some("ping"), None, at("ping\n\n")),
            ev(None, Some("[DONE]"), at("[DONE]\n\n")),
            ev(Some("x"), None, Some(TYPED.len())),
        ]
    }

    #[test]
    fn reads_fields_comments_crlf_and_multi_line_data() {
        let mut r = Reader::default();
        assert_eq!(read(&mut r, &[TYPED.as_bytes()]), typed_events());
    }

    #[test]
    fn every_cut_of_the_stream_reads_the_same() {
        let bytes = TYPED.as_bytes();
        let want = typed_events();
        for a in 0..=bytes.len() {
            let mut r = Reader::default();
            assert_eq!(
                read(&mut r, &[&bytes[..a], &bytes[a..]]),
                want,
                "cut at {a}"
            );
            for b in a..=bytes.len() {
                let mut r = Reader::default();
                let pieces = [&bytes[..a], &bytes[a..b], &bytes[b..]];
                assert_eq!(read(&mut r, &pieces), want, "cuts at {a}, {b}");
            }
        }
        // Byte by byte, too.
        let mut r = Reader::default();
        let bytes: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(read(&mut r, &bytes), want);
    }

    #[test]
    fn the_end_flushes_an_unterminated_event() {
        let mut r = Reader::default();
        assert_eq!(
            read(&mut r, &[b"data: a\n\ndata: [DONE]"]),
            [ev(None, Some("a"), Some(9)), ev(None, Some("[DONE]"), None)]
        );
        assert_eq!(read(&mut r, &[b"data: b\r\n"]), [ev(None, Some("b"), None)]);
        // A name alone is no event, and the next stream starts clean.
        assert_eq!(read(&mut r, &[b"event: x\n"]), []);
        assert_eq!(
            read(&mut r, &[b"data: c\n\n"]),
            [ev(None, Some("c"), Some(9))]
        );
        // Empty data is data.
        assert_eq!(read(&mut r, &[b"data:\n\n"]), [ev(None, Some(""), Some(7))]);
    }

    #[test]
    fn an_oversize_event_is_skipped_with_bounded_memory() {
        let mut r = Reader::new(64);
        let mut seen = Vec::new();
        let mut on = |e: Event<'_>| seen.push(owned(e));
        r.feed(b"data: ", &mut on);
        for _ in 0..100 {
            r.feed(b"xxxxxxxxxx", &mut on);
            assert!(r.pending() <= 64 && r.line.capacity() <= 128);
        }
        r.feed(b"\ndata: more\n\ndata: ok\n\n", &mut on);
        // Many lines that together outgrow it.
        for _ in 0..20 {
            r.feed(b"data: 0123456789\n", &mut on);
            assert!(r.pending() <= 64);
        }
        r.feed(b"\nevent: e\ndata: fine\n\n", &mut on);
        let over = Owned {
            oversize: true,
            ..ev(None, None, None)
        };
        let at = |n: usize| Some(n);
        assert_eq!(
            seen,
            [
                Owned {
                    end: at(13),
                    ..over.clone()
                },
                ev(None, Some("ok"), at(23)),
                Owned {
                    end: at(1),
                    ..over.clone()
                },
                ev(Some("e"), Some("fine"), at(22)),
            ]
        );
        // An oversize line cut by the end is reported at the end.
        r.feed(&[b'x'; 100], &mut |_| unreachable!());
        let mut last = Vec::new();
        r.finish(&mut |e| last.push(owned(e)));
        assert_eq!(last, [over]);
        // A raised bound holds more.
        r.set_bound(1024);
        assert_eq!(
            read(
                &mut r,
                &[&[b"data: ".as_slice(), &[b'y'; 500], b"\n\n"].concat()]
            ),
            [ev(None, Some(&"y".repeat(500)), Some(508))]
        );
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// Whatever arrives, however cut, the reader holds no more than its
        /// bound and reads the same events as from one piece.
        #[test]
        fn any_bytes_any_cuts(bytes in prop::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b':'), Just(b'd'), any::<u8>()], 0..600), cuts in prop::collection::vec(any::<usize>(), 0..6), bound in 1usize..200) {
            let mut whole = Vec::new();
            let mut r = Reader::new(bound);
            r.feed(&bytes, &mut |e| whole.push((e.data.map(<[u8]>::to_vec), e.oversize)));
            r.finish(&mut |e| whole.push((e.data.map(<[u8]>::to_vec), e.oversize)));
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut got = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                r.feed(&bytes[from..c], &mut |e| got.push((e.data.map(<[u8]>::to_vec), e.oversize)));
                prop_assert!(r.pending() <= bound);
                from = c;
            }
            r.finish(&mut |e| got.push((e.data.map(<[u8]>::to_vec), e.oversize)));
            prop_assert_eq!(got, whole);
        }
    }
}
