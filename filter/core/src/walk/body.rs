//! The request body as the walk sees it: held whole and parsed once into the
//! view every concern reads, or, when it streams through, a bounded copy kept
//! to read `model` (and the answer's `usage`) from a body the filter does not hold.

use crate::dialect::features::Features;
use crate::dialect::Dialect;
use crate::json::{Document, Json};

/// A request body held whole, parsed once: the cache keys its tree, routing
/// reads its features and rewrites its bytes. The steps edit its document in
/// place (bytes and tree together, no new parse); it is written to the host
/// once, when the call leaves (see `upstream`).
#[derive(Debug)]
pub(super) struct HeldBody {
    /// The bytes to send (as received, with every step's edits) and their tree.
    pub(super) doc: Document,
    /// Size of the host's buffer, to replace it.
    pub(super) size: usize,
    /// The document differs from the body the host holds.
    pub(super) edited: bool,
    /// What routing rules look at; `None` when the body is no request object.
    pub(super) features: Option<Features>,
    /// The call's dialect, which reads the features.
    dialect: Dialect,
}

impl HeldBody {
    /// Parses a held body of a call of `dialect`: the one parse of the
    /// request.
    pub(super) fn parse(dialect: Dialect, raw: Vec<u8>, size: usize) -> Self {
        let doc = Document::parse(raw);
        let features = doc.tree().and_then(|t| Features::from_json(dialect, t));
        Self {
            doc,
            size,
            edited: false,
            features,
            dialect,
        }
    }

    /// The strict JSON tree; `None` when the body is not strict JSON, or once
    /// no concern needs it any more.
    pub(super) fn tree(&self) -> Option<&Json> {
        self.doc.tree()
    }

    /// The bytes to send.
    pub(super) fn raw(&self) -> &[u8] {
        self.doc.bytes()
    }

    /// A step edited the document: it is to be written, and what routing
    /// reads follows the edit.
    pub(super) fn was_edited(&mut self) {
        self.edited = true;
        let dialect = self.dialect;
        self.features = self
            .doc
            .tree()
            .and_then(|t| Features::from_json(dialect, t));
    }

    /// Frees the tree once only the bytes and the features are needed.
    pub(super) fn drop_tree(&mut self) {
        self.doc.drop_tree();
    }
}

/// Largest body copied aside by default: past it the copy is useless (a cut
/// JSON document) and is dropped.
pub(super) const MAX_OBSERVED_BODY: usize = 1 << 20;

/// Bytes of a body as it passes, up to a bound.
#[derive(Debug)]
pub(super) struct BodyCopy {
    /// `None` once the body outgrew the bound.
    buf: Option<Vec<u8>>,
    limit: usize,
}

impl Default for BodyCopy {
    fn default() -> Self {
        Self::with_limit(MAX_OBSERVED_BODY)
    }
}

impl BodyCopy {
    /// A copy bounded by `limit` bytes.
    pub(super) fn with_limit(limit: usize) -> Self {
        Self {
            buf: Some(Vec::new()),
            limit,
        }
    }

    /// Raises the bound to at least `limit` bytes.
    pub(super) fn raise_limit(&mut self, limit: usize) {
        self.limit = self.limit.max(limit);
    }

    /// Appends `chunk`, or drops the copy when it would pass the bound.
    pub(super) fn append(&mut self, chunk: &[u8]) {
        let Some(buf) = self.buf.as_mut() else {
            return;
        };
        if buf.len().saturating_add(chunk.len()) > self.limit {
            self.buf = None;
            return;
        }
        buf.extend_from_slice(chunk);
    }

    /// False once the body outgrew the bound: nothing more is kept.
    pub(super) fn is_open(&self) -> bool {
        self.buf.is_some()
    }

    /// The whole body so far; `None` once it outgrew the bound.
    pub(super) fn bytes(&self) -> Option<&[u8]> {
        self.buf.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_past_its_bound_is_dropped() {
        let mut c = BodyCopy::with_limit(4);
        c.append(b"ab");
        c.append(b"cd");
        assert_eq!(c.bytes(), Some(&b"abcd"[..]));
        c.append(b"e");
        assert_eq!(c.bytes(), None);
        c.append(b"");
        assert_eq!(c.bytes(), None);
    }

    #[test]
    fn a_raised_bound_keeps_more() {
        let mut c = BodyCopy::with_limit(2);
        c.raise_limit(1);
        c.raise_limit(3);
        c.append(b"abc");
        assert_eq!(c.bytes(), Some(&b"abc"[..]));
    }
}
