//! The one pass of the built-in detectors over a text: each byte is looked
//! at once, each detector tried where its first byte may be, and every try
//! reads a bounded stretch or a run the pass then steps over, so the work
//! is linear in the text.

use super::detector::{Detector, DetectorId as D, Set};
use super::scan::{Scan, Sink};
use super::secrets::key_char;

/// Adds what the built-in detectors of `set` find in the text to `sink`,
/// each finding as its detector saw it (one value may be two things: a
/// card number after `password=`).
///
/// A key, a JSON web token, a PEM block and the personal data of a fixed
/// shape are taken whole and the scan goes on after them. What a detector
/// finds by its context (the credential after a scheme or a name, an
/// e-mail address around its `@`) is scanned again, so a secret that
/// starts inside it (`private_key: -----BEGIN …`) is found as well; each
/// byte is read a bounded number of times.
pub(super) fn pass(s: &Scan<'_>, set: Set, sink: &mut Sink<'_>) {
    let mut i = 0;
    // Where the last shape taken whole ended: an address does not reach
    // back into it.
    let mut done = 0;
    // A JWT's first part that is no JWT: none starts inside it either.
    let mut no_jwt_until = 0;
    // The end of the last named value: a name inside it is not read again
    // (`token:token:token…` would be read to its end at each `:`).
    let mut named_until = 0;
    while i < s.b.len() {
        s.step(1);
        let b = s.at(i);
        let context = match b {
            b'@' if set.has(D::Email) => s.email(i, done).map(|r| (D::Email, r, i + 1)),
            b':' | b'=' if i >= named_until && set.has(D::NamedCredential) => s.named(i).map(|r| {
                named_until = r.end;
                (D::NamedCredential, r.clone(), r.start)
            }),
            b'b' | b'B' if s.starts_here(i) => s
                .scheme(i)
                .filter(|(id, _)| set.has(*id))
                .map(|(id, r)| (id, r.clone(), r.start)),
            _ => None,
        };
        if let Some((id, r, next)) = context {
            if !sink.hit(Detector::Builtin(id), r) {
                return;
            }
            i = next;
            continue;
        }
        let whole = if (b != b'e' || i >= no_jwt_until) && s.starts_here(i) {
            let found = s.secret(i).filter(|(id, _)| set.has(*id));
            if b == b'e' && found.is_none() {
                no_jwt_until = s.run(i, key_char);
            }
            found.or_else(|| s.personal(i, set))
        } else {
            None
        };
        match whole {
            Some((id, end)) if end > i => {
                if !sink.hit(Detector::Builtin(id), i..end) {
                    return;
                }
                i = end;
                done = end;
            }
            _ => i += 1,
        }
    }
}
