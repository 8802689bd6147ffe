//! Response bodies: nothing, a short text, pieces of a file (a whole
//! file, a range, or the parts of a `multipart/byteranges` answer with
//! their part headers between them), or a stream produced as it goes (a
//! third-party copy's performance markers, sent chunked).
//!
//! File pieces are read with `pread` as hyper asks for the next frame, on
//! the connection's own thread (blocking is fine there: nobody else runs
//! on it), [`CHUNK`] bytes at a time, so a GET of any size holds one chunk
//! in memory. Bytes sent are reported to the Observer as they are produced.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::task::{Context, Poll};

use fatpipe_engine::{Flow, Report};
use hyper::body::{Bytes, Frame, SizeHint};

/// Bytes read from the file per frame.
pub const CHUNK: usize = 256 * 1024;

/// One piece of a body.
#[derive(Debug)]
pub enum Seg {
    /// Bytes in memory.
    Bytes(Bytes),
    /// `len` bytes of the body's file from `off`.
    File {
        /// Where they start.
        off: u64,
        /// How many.
        len: u64,
    },
}

/// A response body.
pub struct Body {
    segs: VecDeque<Seg>,
    file: Option<File>,
    report: Option<Report>,
    left: u64,
    stream: Option<Stream>,
}

/// A body produced as it goes (its length unknown: sent chunked).
pub type Stream = Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = io::Error>>>;

impl Body {
    /// No body.
    pub fn empty() -> Body {
        Body {
            segs: VecDeque::new(),
            file: None,
            report: None,
            left: 0,
            stream: None,
        }
    }

    /// A body in memory.
    pub fn text(s: impl Into<Bytes>) -> Body {
        let b: Bytes = s.into();
        let left = b.len() as u64;
        Body {
            segs: VecDeque::from([Seg::Bytes(b)]),
            file: None,
            report: None,
            left,
            stream: None,
        }
    }

    /// Pieces of `file`, in order; file bytes are reported as sent.
    pub fn file(file: File, segs: Vec<Seg>, report: Option<Report>) -> Body {
        let left = segs
            .iter()
            .map(|s| match s {
                Seg::Bytes(b) => b.len() as u64,
                Seg::File { len, .. } => *len,
            })
            .sum();
        Body {
            segs: segs.into(),
            file: Some(file),
            report,
            left,
            stream: None,
        }
    }

    /// A body produced as it goes.
    pub fn stream(stream: Stream) -> Body {
        Body {
            stream: Some(stream),
            ..Body::empty()
        }
    }

    /// The body's length in bytes.
    pub fn len(&self) -> u64 {
        self.left
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if let Some(s) = &mut this.stream {
            return s.as_mut().poll_frame(cx);
        }
        loop {
            let Some(seg) = this.segs.front_mut() else {
                return Poll::Ready(None);
            };
            match seg {
                Seg::Bytes(b) => {
                    let b = std::mem::take(b);
                    this.segs.pop_front();
                    this.left = this.left.saturating_sub(b.len() as u64);
                    if b.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Seg::File { off, len } => {
                    if *len == 0 {
                        this.segs.pop_front();
                        continue;
                    }
                    let Some(file) = &this.file else {
                        return Poll::Ready(Some(Err(io::Error::other("no file"))));
                    };
                    let want = (*len).min(CHUNK as u64) as usize;
                    let mut buf = vec![0u8; want];
                    let n = loop {
                        match file.read_at(&mut buf, *off) {
                            Ok(n) => break n,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Poll::Ready(Some(Err(e))),
                        }
                    };
                    if n == 0 {
                        // The file shrank under the answer: end the
                        // connection rather than send short.
                        return Poll::Ready(Some(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the file shrank while it was sent",
                        ))));
                    }
                    buf.truncate(n);
                    *off += n as u64;
                    *len -= n as u64;
                    this.left = this.left.saturating_sub(n as u64);
                    if let Some(r) = &this.report {
                        r.bytes(Flow::Sent, n as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.stream {
            Some(s) => s.is_end_stream(),
            None => self.segs.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.stream {
            Some(s) => s.size_hint(),
            None => SizeHint::with_exact(self.left),
        }
    }
}
