//! Escaping text that came from the peer before it reaches a terminal or a
//! log.
//!
//! A server's refusal reason, a file name in a note, a session's service
//! name: all are bytes a peer chose. Written raw, an ESC starts a terminal
//! control sequence (clear the screen, retitle the window, rewrite what the
//! user sees), a CR overwrites the line, and a bidi override reverses what
//! follows (the scp CVE-2019-6109 class). [`escape`] writes every such
//! character as a visible escape: `\x1b` for C0 controls and DEL, `\u{9b}`
//! for C1 controls, `\u{202e}` for the bidi and line-separator marks. Text
//! without any comes back borrowed, so the common case costs a scan.
//!
//! It lives here, in the lowest crate both ends share, so that every place
//! that shows peer text (the protocol's own error messages, the services,
//! the binary's error line and the server's log) uses the same function.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control, bidi-override and line-separator character
/// written as an escape (`\x1b`, `\u{202e}`); everything else unchanged.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !needs_escape(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// True for characters a terminal acts on rather than shows: C0 (incl.
/// ESC, CR, LF, TAB), DEL, C1 (incl. CSI U+009B), the bidi embeddings,
/// overrides, isolates and marks, and the Unicode line/paragraph
/// separators.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        let s = "copy refused: 'data/ünïcode ✓.txt' exists";
        assert!(matches!(escape(s), Cow::Borrowed(x) if x == s));
    }

    #[test]
    fn c0_controls_esc_cr_lf_tab_and_del_are_hex_escaped() {
        assert_eq!(
            escape("a\x1b[2Jb\rc\nd\te\x7f\0"),
            "a\\x1b[2Jb\\x0dc\\x0ad\\x09e\\x7f\\x00"
        );
    }

    #[test]
    fn c1_controls_are_escaped() {
        // U+009B is CSI: on an 8-bit terminal it starts a sequence alone.
        assert_eq!(escape("x\u{9b}31m\u{85}"), "x\\u{9b}31m\\u{85}");
    }

    #[test]
    fn bidi_overrides_isolates_and_separators_are_escaped() {
        assert_eq!(
            escape("evil\u{202e}txt.exe\u{2066}\u{2069}\u{200f}\u{2028}"),
            "evil\\u{202e}txt.exe\\u{2066}\\u{2069}\\u{200f}\\u{2028}"
        );
    }

    #[test]
    fn escaped_text_has_nothing_left_to_escape() {
        let once = escape("\x1b]0;title\x07\u{202d}").into_owned();
        assert_eq!(escape(&once), once.as_str());
    }
}
