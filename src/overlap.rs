//! Overlapping views: a kernel that writes a view while another binding of the same dispatch
//! or plan reads or writes bytes of it races (no kernel runs in place), so every plan checks
//! the views it takes with [`check_disjoint`], and every dispatch its bindings.

use crate::error::{Error, Result};
use crate::pipeline::BufferView;

/// Whether a view is written or only read by the kernels that bind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Only read: read-only views may share bytes.
    Read,
    /// Written (or read and written).
    Write,
}

/// Whether `a` and `b` are views of one buffer that share at least one byte.
fn overlap(a: &BufferView<'_>, b: &BufferView<'_>) -> bool {
    a.buffer == b.buffer
        && a.size > 0
        && b.size > 0
        && a.offset < b.offset.saturating_add(b.size)
        && b.offset < a.offset.saturating_add(a.size)
}

/// Checks that no written view among `views` (named, with their use) shares a byte with
/// another view of the list.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first two views that overlap where one is written,
/// with their byte ranges.
pub(crate) fn check_disjoint(views: &[(&str, BufferView<'_>, Use)]) -> Result<()> {
    for (i, (a, va, ua)) in views.iter().enumerate() {
        for (b, vb, ub) in &views[i + 1..] {
            if (*ua == Use::Write || *ub == Use::Write) && overlap(va, vb) {
                let range =
                    |v: &BufferView<'_>| format!("bytes {} .. {}", v.offset, v.offset.saturating_add(v.size));
                let written = if *ua == Use::Write { a } else { b };
                return Err(Error::invalid(format!(
                    "`{a}` ({}) and `{b}` ({}) are overlapping views of one buffer, and \
                     `{written}` is written: give them disjoint bytes (no kernel runs in place)",
                    range(va),
                    range(vb),
                )));
            }
        }
    }
    Ok(())
}
