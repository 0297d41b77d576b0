//! Deny-lists: an operator's words and phrases, found in one pass however
//! many there are (an Aho–Corasick automaton: a trie of the words, each
//! state linked to the longest suffix that is also in it, so no character
//! is read twice). Case is folded for the letters of the Latin, Greek and
//! Cyrillic scripts (ASCII, Latin-1, Latin Extended-A, basic Greek and
//! Cyrillic); a word that starts or ends with a letter or digit of those
//! scripts is found only as a whole word there (`ban` is not in `banana`),
//! while one in a script written without spaces (Chinese, Japanese) is
//! found anywhere.

use super::detector::Detector;
use super::scan::Sink;

/// No pattern.
const NONE: u32 = u32::MAX;
/// Longest word, bytes (so in characters too).
pub const MAX_WORD_BYTES: usize = 128;
/// Most words, and most bytes of them all, over every rule.
pub const MAX_WORDS: usize = 1024;
/// Most bytes of all the words.
pub const MAX_TOTAL_BYTES: usize = 16 << 10;
/// Where the last characters read started, for a match's start.
const RING: usize = MAX_WORD_BYTES;

#[derive(Debug, Clone)]
struct State {
    /// Its edges, sorted by character.
    edges: Vec<(char, u32)>,
    links: Links,
}

#[derive(Debug, Clone, Copy)]
struct Links {
    /// The state of the longest proper suffix of its path in the trie.
    fail: u32,
    /// The last pattern that ends here ([`NONE`]).
    out: u32,
    /// The nearest state down the fail links where a pattern ends (0: none).
    dict: u32,
}

/// The root's links, and those of a state that is not.
const ROOT: Links = Links {
    fail: 0,
    out: NONE,
    dict: 0,
};

#[derive(Debug, Clone, Copy)]
struct Pattern {
    rule: u16,
    /// Its length in characters.
    chars: u16,
    /// Its first and last characters need a word's edge beside them.
    open: bool,
    close: bool,
    /// Another pattern that ends in the same state ([`NONE`]).
    same: u32,
}

/// The automaton of every rule's words.
#[derive(Clone)]
pub(super) struct Words {
    states: Vec<State>,
    patterns: Vec<Pattern>,
}

/// `c` in lowercase, for the scripts folded.
pub(super) fn fold(c: char) -> char {
    let u = u32::from(c);
    let lower = match u {
        0x41..=0x5A | 0xC0..=0xDE if u != 0xD7 => u + 0x20,
        0x100..=0x137 | 0x14A..=0x177 if u % 2 == 0 => u + 1,
        0x139..=0x148 | 0x179..=0x17E if u % 2 == 1 => u + 1,
        0x391..=0x3AB if u != 0x3A2 => u + 0x20,
        0x3C2 => 0x3C3,
        0x400..=0x40F => u + 0x50,
        0x410..=0x42F => u + 0x20,
        _ => u,
    };
    char::from_u32(lower).unwrap_or(c)
}

/// A letter or digit of the folded scripts, or `_`: part of a word.
fn wordy(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || c == '_'
        || matches!(u32::from(c), 0xC0..=0x24F | 0x370..=0x4FF) && c != '×' && c != '÷'
}

impl Words {
    /// The automaton of `words`, each with its rule. The caller bounds
    /// their number and lengths.
    pub(super) fn new<'w>(words: impl IntoIterator<Item = (&'w str, u16)>) -> Self {
        let root = State {
            edges: Vec::new(),
            links: ROOT,
        };
        let mut w = Self {
            states: vec![root.clone()],
            patterns: Vec::new(),
        };
        for (word, rule) in words {
            let mut s = 0;
            let mut chars = 0u16;
            for c in word.chars().map(fold) {
                chars = chars.saturating_add(1);
                s = match w.edge(s, c) {
                    Some(t) => t,
                    None => {
                        let t = w.states.len() as u32;
                        w.states.push(root.clone());
                        if let Some(st) = w.states.get_mut(s as usize) {
                            let k = st.edges.partition_point(|e| e.0 < c);
                            st.edges.insert(k, (c, t));
                        }
                        t
                    }
                };
            }
            let (Some(first), Some(last)) = (word.chars().next(), word.chars().next_back()) else {
                continue;
            };
            let p = w.patterns.len() as u32;
            if let Some(st) = w.states.get_mut(s as usize) {
                w.patterns.push(Pattern {
                    rule,
                    chars,
                    open: wordy(first),
                    close: wordy(last),
                    same: st.links.out,
                });
                st.links.out = p;
            }
        }
        // Breadth first, so a state's fail state is done before it.
        let mut queue = vec![0u32];
        let mut head = 0;
        while let Some(&s) = queue.get(head) {
            head += 1;
            let fail = w.links(s).fail;
            let mut k = 0;
            while let Some(&(c, t)) = w.states.get(s as usize).and_then(|st| st.edges.get(k)) {
                k += 1;
                queue.push(t);
                let mut to = 0;
                if s != 0 {
                    let mut f = fail;
                    to = loop {
                        if let Some(x) = w.edge(f, c) {
                            break x;
                        }
                        if f == 0 {
                            break 0;
                        }
                        f = w.links(f).fail;
                    };
                }
                let below = w.links(to);
                let dict = if below.out != NONE { to } else { below.dict };
                if let Some(st) = w.states.get_mut(t as usize) {
                    st.links.fail = to;
                    st.links.dict = dict;
                }
            }
        }
        w
    }

    /// Words or phrases in it.
    pub(super) fn len(&self) -> usize {
        self.patterns.len()
    }

    /// State `s`'s links.
    fn links(&self, s: u32) -> Links {
        self.states.get(s as usize).map_or(ROOT, |st| st.links)
    }

    /// The edge from `s` on `c`.
    fn edge(&self, s: u32, c: char) -> Option<u32> {
        let edges = &self.states.get(s as usize)?.edges;
        let k = edges.binary_search_by_key(&c, |e| e.0).ok()?;
        edges.get(k).map(|e| e.1)
    }

    /// The state after `c` from `s`.
    fn step(&self, mut s: u32, c: char, steps: &mut usize) -> u32 {
        loop {
            *steps += 1;
            if let Some(t) = self.edge(s, c) {
                return t;
            }
            if s == 0 {
                return 0;
            }
            s = self.links(s).fail;
        }
    }

    /// Adds each word of `text` found to `sink`; returns the steps taken.
    pub(super) fn find(&self, text: &str, sink: &mut Sink<'_>) -> usize {
        let mut steps = 0;
        let mut ring = [0usize; RING];
        let mut read = 0usize;
        let mut s = 0;
        for (i, c) in text.char_indices() {
            if let Some(slot) = ring.get_mut(read % RING) {
                *slot = i;
            }
            read += 1;
            s = self.step(s, fold(c), &mut steps);
            let end = i + c.len_utf8();
            let after = text.get(end..).and_then(|t| t.chars().next());
            let mut t = match self.links(s) {
                Links {
                    out: NONE, dict, ..
                } => dict,
                _ => s,
            };
            while t != 0 {
                let mut p = self.links(t).out;
                while let Some(pat) = self.patterns.get(p as usize) {
                    steps += 1;
                    let chars = usize::from(pat.chars);
                    let start = read
                        .checked_sub(chars)
                        .and_then(|k| ring.get(k % RING))
                        .copied()
                        .unwrap_or(0);
                    let before = text.get(..start).and_then(|t| t.chars().next_back());
                    let edge = |c: Option<char>| c.is_none_or(|c| !wordy(c));
                    let whole = (!pat.open || edge(before)) && (!pat.close || edge(after));
                    if whole && !sink.hit(Detector::Custom(pat.rule), start..end) {
                        return steps;
                    }
                    p = pat.same;
                }
                t = self.links(t).dict;
            }
        }
        steps
    }
}
