//! Performance markers: the text a third-party copy's `COPY` answer
//! streams, as davix (gfal2, FTS) parses it, and a parser of it for
//! `fatpipe copy URL URL`.
//!
//! The grammar (XRootD's, observed on the wire): a block
//!
//! ```text
//! Perf Marker
//! Timestamp: 1795797420
//! Stripe Index: 0
//! Stripe Bytes Transferred: 50000000
//! Total Stripe Count: 1
//! RemoteConnections: tcp:127.0.0.1:18081
//! End
//! ```
//!
//! per marker, and a last line `success: Created` or `failure: <why>`.
//! davix skips the one character after each colon, so it is always a
//! space; it matches keys case-insensitively and ignores unknown lines.

use std::net::SocketAddr;

/// One marker's text: `bytes` written so far on one stripe, the remote
/// connections open.
pub fn marker(unix_secs: u64, bytes: u64, remote: &[SocketAddr]) -> String {
    let mut s = format!(
        "Perf Marker\nTimestamp: {unix_secs}\nStripe Index: 0\n\
         Stripe Bytes Transferred: {bytes}\nTotal Stripe Count: 1\n"
    );
    if !remote.is_empty() {
        let list: Vec<String> = remote.iter().map(|a| format!("tcp:{a}")).collect();
        s.push_str("RemoteConnections: ");
        s.push_str(&list.join(","));
        s.push('\n');
    }
    s.push_str("End\n");
    s
}

/// The last line of a successful copy.
pub const SUCCESS: &str = "success: Created\n";

/// The last line of a failed copy: `why` on one line (control characters
/// and line breaks become spaces), at most [`MAX_LINE`] bytes.
pub fn failure(why: &str) -> String {
    let mut line = String::from("failure: ");
    for c in why.chars() {
        if line.len() + c.len_utf8() + 1 > MAX_LINE {
            break;
        }
        line.push(if c.is_control() { ' ' } else { c });
    }
    line.push('\n');
    line
}

/// The longest line the parser keeps (davix reads 1024-byte lines); the
/// rest of a longer line is dropped.
pub const MAX_LINE: usize = 1024;
/// The most stripes summed (davix ignores a count above 8192).
pub const MAX_STRIPES: u64 = 8192;
/// The most remote connections kept from one marker.
pub const MAX_REMOTE: usize = 64;

/// What a marker stream said so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes transferred, summed over the stripes of the last marker.
    pub bytes: u64,
    /// Markers seen.
    pub markers: u64,
    /// The last marker's `RemoteConnections`.
    pub remote: Vec<String>,
}

/// How the stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `success…`.
    Success,
    /// `failure: …` / `failed…` (the line, escaped, capped).
    Failure(String),
    /// `aborted…`.
    Aborted,
}

/// A streaming parser of a marker body: feed it bytes as they come.
/// Memory is bounded by [`MAX_LINE`] and [`MAX_STRIPES`] whatever it is
/// fed.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    overlong: bool,
    /// Per-stripe bytes of the marker being read: (index, bytes).
    stripes: Vec<(u64, u64)>,
    index: u64,
    count: u64,
    remote: Vec<String>,
    in_marker: bool,
    /// What was learnt so far.
    pub progress: Progress,
    /// Set once the end line was read (later bytes are ignored).
    pub end: Option<End>,
}

impl Parser {
    /// A parser at the start of a body.
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Feeds the next bytes of the body.
    pub fn feed(&mut self, data: &[u8]) {
        for &b in data {
            if self.end.is_some() {
                return;
            }
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.overlong = false;
                self.line_done(&line);
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            } else {
                self.overlong = true;
            }
        }
    }

    /// The body ended: a last line without a newline counts.
    pub fn finish(&mut self) {
        if self.end.is_none() && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line);
        }
    }

    fn line_done(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let line = text.trim();
        let lower = line.to_ascii_lowercase();
        if lower == "perf marker" {
            self.in_marker = true;
            self.index = 0;
            self.count = 1;
            self.remote.clear();
            return;
        }
        if lower == "end" {
            if self.in_marker {
                self.in_marker = false;
                let n = self.count.clamp(1, MAX_STRIPES);
                self.progress.markers += 1;
                self.stripes.retain(|(i, _)| *i < n);
                self.progress.bytes = self
                    .stripes
                    .iter()
                    .fold(0u64, |a, (_, b)| a.saturating_add(*b));
                self.progress.remote = std::mem::take(&mut self.remote);
            }
            return;
        }
        if lower.starts_with("success") {
            self.end = Some(End::Success);
            return;
        }
        if lower.starts_with("failure") || lower.starts_with("failed") {
            let why: String = line
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            self.end = Some(End::Failure(why));
            return;
        }
        if lower.starts_with("aborted") {
            self.end = Some(End::Aborted);
            return;
        }
        if !self.in_marker {
            return;
        }
        let Some((key, value)) = line.split_once(':') else {
            return;
        };
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim();
        let num = || -> Option<u64> {
            (value.len() <= 20 && !value.is_empty() && value.bytes().all(|c| c.is_ascii_digit()))
                .then(|| value.parse().ok())
                .flatten()
        };
        match key.as_str() {
            "stripe index" => {
                if let Some(i) = num().filter(|&i| i < MAX_STRIPES) {
                    self.index = i;
                }
            }
            "total stripe count" => {
                if let Some(c) = num().filter(|&c| (1..=MAX_STRIPES).contains(&c)) {
                    self.count = c;
                }
            }
            "stripe bytes transferred" => {
                if let Some(b) = num() {
                    let index = self.index;
                    match self.stripes.iter().position(|(i, _)| *i == index) {
                        Some(k) => self.stripes[k].1 = b,
                        None if (self.stripes.len() as u64) < MAX_STRIPES => {
                            self.stripes.push((index, b))
                        }
                        None => {}
                    }
                }
            }
            "remoteconnections" => {
                self.remote = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .take(MAX_REMOTE)
                    .map(|s| s.chars().take(64).collect())
                    .collect();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_as_davix_reads_it() {
        let a: SocketAddr = "127.0.0.1:18081".parse().unwrap();
        let b: SocketAddr = "[::1]:443".parse().unwrap();
        let m = marker(1795797420, 50_000_000, &[a, b]);
        assert_eq!(
            m,
            "Perf Marker\nTimestamp: 1795797420\nStripe Index: 0\n\
             Stripe Bytes Transferred: 50000000\nTotal Stripe Count: 1\n\
             RemoteConnections: tcp:127.0.0.1:18081,tcp:[::1]:443\nEnd\n"
        );
        // davix reads the value 26 characters after the key's start.
        let line = m.lines().find(|l| l.starts_with("Stripe Bytes")).unwrap();
        assert_eq!(&line[26..], "50000000");
        let line = m.lines().find(|l| l.starts_with("Total Stripe")).unwrap();
        assert_eq!(&line[20..], "1");
        assert!(!marker(0, 0, &[]).contains("Remote"));
    }

    #[test]
    fn a_failure_is_one_capped_line() {
        let f = failure("a\nb\r\tc");
        assert_eq!(f, "failure: a b  c\n");
        let long = failure(&"x".repeat(5000));
        assert!(long.len() <= MAX_LINE);
        assert!(long.ends_with('\n'));
    }

    #[test]
    fn the_parser_sums_stripes_and_reads_the_end() {
        let mut p = Parser::new();
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        p.feed(marker(1, 100, &[a]).as_bytes());
        assert_eq!(p.progress.bytes, 100);
        assert_eq!(p.progress.remote, vec!["tcp:10.0.0.1:80".to_string()]);
        // Two stripes, indented, mixed case, split at any byte.
        let text = "  perf marker\n Stripe Index: 0\nStripe Bytes Transferred: 10\n\
                    Total Stripe Count: 2\nend\nPerf Marker\nStripe Index: 1\n\
                    Stripe Bytes Transferred: 5\nTotal Stripe Count: 2\nEnd\nunknown: x\n";
        for b in text.as_bytes() {
            p.feed(&[*b]);
        }
        assert_eq!(p.progress.bytes, 15);
        assert_eq!(p.progress.markers, 3);
        assert!(p.end.is_none());
        p.feed(b"success: Created");
        assert!(p.end.is_none());
        p.finish();
        assert_eq!(p.end, Some(End::Success));
        let mut p = Parser::new();
        p.feed(b"failure: Remote side failed with status code 409\n");
        assert!(matches!(p.end, Some(End::Failure(ref s)) if s.contains("409")));
        let mut p = Parser::new();
        p.feed(&vec![b'a'; 100_000]);
        p.feed(b"\nStripe Bytes Transferred: 99999999999999999999999999\n");
        p.finish();
        assert_eq!(p.progress.bytes, 0);
        assert!(p.end.is_none());
    }
}
