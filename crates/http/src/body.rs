//! Response bodies: nothing, a short text, pieces of a file (a whole
//! file, a range, or the parts of a `multipart/byteranges` answer with
//! their part headers between them), or a stream produced as it goes (a
//! third-party copy's performance markers, sent chunked).
//!
//! File pieces are read with `pread` as hyper asks for the next frame, on
//! the connection's own thread (blocking is fine there: nobody else runs
//! on it), [`CHUNK`] bytes at a time, so a GET of any size holds one chunk
//! in memory. Bytes sent are reported to the Observer as they are produced.
//!
//! Zero copy (plain HTTP): a body told [`Body::zero_copy`] reads nothing.
//! For each piece of the file it queues a [`Piece`] (file, offset, length)
//! on the connection's [`Handoff`] and hands hyper a stand-in frame of the
//! same length: a slice of one process-wide buffer ([`stand_in`]) that is
//! never written or read. hyper queues body frames as they are (its
//! vectored "queue" write strategy: conn.rs asks for it) and passes them on
//! to the socket wrapper's `poll_write_vectored`, which recognises a
//! stand-in slice by its address and sends the piece with `sendfile(2)`
//! from the file instead (`Handoff::send`). Pieces are sent in the order
//! they were queued, so the front piece is always the one being written;
//! a stand-in slice that does not match it fails the connection rather
//! than send wrong bytes.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};

use fatpipe_engine::{Flow, Report};
use hyper::body::{Bytes, Frame, SizeHint};

/// Bytes read from the file per frame.
pub const CHUNK: usize = 256 * 1024;

/// Bytes of the file one zero-copy frame stands for (nothing is read or
/// held for it: the stand-in buffer is virtual memory never touched).
pub const ZC_CHUNK: usize = 16 * 1024 * 1024;

/// The one stand-in buffer zero-copy frames are slices of. Allocated
/// zeroed (fresh pages from the kernel) and never written or read by the
/// process, so it costs address space, not memory.
fn stand_in() -> &'static Bytes {
    static BUF: OnceLock<Bytes> = OnceLock::new();
    BUF.get_or_init(|| Bytes::from(vec![0u8; ZC_CHUNK]))
}

/// Where `s` sits in the stand-in buffer, if it is a slice of it.
fn stand_in_offset(s: &[u8]) -> Option<usize> {
    let base = stand_in().as_ptr() as usize;
    let p = s.as_ptr() as usize;
    (!s.is_empty() && p >= base && p < base + ZC_CHUNK).then(|| p - base)
}

/// A piece of a file queued for `sendfile` by a zero-copy body.
struct Piece {
    file: Rc<File>,
    off: u64,
    len: u64,
    /// Bytes of it already sent.
    sent: u64,
}

/// The zero-copy hand-off between a connection's response bodies and its
/// socket: the file pieces the stand-in frames hyper is writing stand for,
/// in order.
#[derive(Default)]
pub struct Handoff {
    queue: RefCell<VecDeque<Piece>>,
}

impl Handoff {
    /// Where the first stand-in frame is in `bufs`, if any.
    pub fn first_stand_in(bufs: &[io::IoSlice<'_>]) -> Option<usize> {
        bufs.iter().position(|b| stand_in_offset(b).is_some())
    }

    /// Whether `s` is (a slice of) a stand-in frame.
    pub fn is_stand_in(s: &[u8]) -> bool {
        stand_in_offset(s).is_some()
    }

    /// Sends the stand-in slice `s` (the first buffer hyper is writing) as
    /// the bytes of the front piece, with `sendfile` to `tcp`.
    pub fn send(
        &self,
        cx: &mut Context<'_>,
        tcp: &tokio::net::TcpStream,
        s: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mismatch = || io::Error::other("zero-copy frame out of step with its file piece");
        let Some(at) = stand_in_offset(s) else {
            return Poll::Ready(Err(mismatch()));
        };
        let mut queue = self.queue.borrow_mut();
        let Some(piece) = queue.front_mut() else {
            return Poll::Ready(Err(mismatch()));
        };
        if at as u64 != piece.sent || s.len() as u64 > piece.len - piece.sent {
            return Poll::Ready(Err(mismatch()));
        }
        loop {
            ready!(tcp.poll_write_ready(cx))?;
            let mut off = piece.off + piece.sent;
            let r = tcp.try_io(tokio::io::Interest::WRITABLE, || {
                fatpipe_sys::sendfile(tcp, &*piece.file, &mut off, s.len())
            });
            match r {
                Ok(t) if t.bytes == 0 => {
                    // The file shrank under the answer: end the connection
                    // rather than send short.
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was sent",
                    )));
                }
                Ok(t) => {
                    piece.sent += t.bytes as u64;
                    if piece.sent == piece.len {
                        queue.pop_front();
                    }
                    return Poll::Ready(Ok(t.bytes));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

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
    file: Option<Rc<File>>,
    report: Option<Report>,
    left: u64,
    handoff: Option<Rc<Handoff>>,
    /// File bytes handed on so far.
    sent: u64,
    /// Called once, when the body is dropped: the file bytes handed on,
    /// and whether that was all of the body.
    on_end: Option<Box<dyn FnOnce(u64, bool)>>,
    stream: Option<Stream>,
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Some(f) = self.on_end.take() {
            f(self.sent, self.left == 0);
        }
    }
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
            handoff: None,
            sent: 0,
            on_end: None,
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
            handoff: None,
            sent: 0,
            on_end: None,
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
            file: Some(Rc::new(file)),
            report,
            left,
            handoff: None,
            sent: 0,
            on_end: None,
            stream: None,
        }
    }

    /// A body produced as it goes.
    pub fn stream(stream: Stream) -> Body {
        let mut body = Body::empty();
        body.stream = Some(stream);
        body
    }

    /// Whether the body is pieces of a file.
    pub fn is_file(&self) -> bool {
        self.file.is_some()
    }

    /// Calls `f` when the body is dropped (sent, or the connection gone)
    /// with the file bytes handed on and whether that was all of it.
    pub fn on_end(mut self, f: impl FnOnce(u64, bool) + 'static) -> Body {
        self.on_end = Some(Box::new(f));
        self
    }

    /// Sends the file's pieces through `handoff` (zero copy) instead of
    /// reading them. Only for a connection whose socket wrapper sends the
    /// hand-off's pieces (conn.rs, plain HTTP).
    pub fn zero_copy(mut self, handoff: &Rc<Handoff>) -> Body {
        if self.file.is_some() {
            self.handoff = Some(Rc::clone(handoff));
        }
        self
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
                    if let Some(h) = &this.handoff {
                        let n = (*len).min(ZC_CHUNK as u64);
                        h.queue.borrow_mut().push_back(Piece {
                            file: Rc::clone(file),
                            off: *off,
                            len: n,
                            sent: 0,
                        });
                        *off += n;
                        *len -= n;
                        this.left = this.left.saturating_sub(n);
                        this.sent += n;
                        if let Some(r) = &this.report {
                            r.bytes(Flow::Sent, n);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(stand_in().slice(..n as usize)))));
                    }
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
                    this.sent += n as u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Buf;
    use std::io::Read;
    use std::task::Waker;

    fn frame(body: &mut Body) -> Option<Bytes> {
        let mut cx = Context::from_waker(Waker::noop());
        match hyper::body::Body::poll_frame(Pin::new(body), &mut cx) {
            Poll::Ready(Some(Ok(f))) => f.into_data().ok(),
            _ => None,
        }
    }

    /// Writes `b` as the socket wrapper does: stand-ins through the
    /// hand-off, partial sends continued from where they stopped.
    fn write_all(
        rt: &tokio::runtime::Runtime,
        h: &Handoff,
        tcp: &tokio::net::TcpStream,
        mut b: Bytes,
    ) -> io::Result<()> {
        while !b.is_empty() {
            let n = rt.block_on(std::future::poll_fn(|cx| {
                if Handoff::is_stand_in(&b) {
                    h.send(cx, tcp, &b)
                } else {
                    tcp.poll_write_ready(cx)
                        .map_ok(|()| tcp.try_write(&b).unwrap_or(0))
                }
            }))?;
            b.advance(n);
        }
        Ok(())
    }

    #[test]
    fn zero_copy_frames_carry_the_files_bytes_and_a_frame_out_of_step_fails() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(ZC_CHUNK + 12345))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &data).expect("write");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("c");
        let (srv, _) = listener.accept().expect("accept");
        srv.set_nonblocking(true).expect("nonblocking");
        let tcp = rt
            .block_on(async { tokio::net::TcpStream::from_std(srv) })
            .expect("tokio socket");
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut peer = peer;
            let _ = peer.read_to_end(&mut got);
            got
        });
        let h = Rc::new(Handoff::default());
        let file = File::open(&path).expect("open");
        let segs = vec![
            Seg::File { off: 5, len: 10 },
            Seg::Bytes(Bytes::from_static(b"--")),
            Seg::File {
                off: 100,
                len: ZC_CHUNK as u64 + 200,
            },
        ];
        let mut body = Body::file(file, segs, None).zero_copy(&h);
        let mut want = data[5..15].to_vec();
        want.extend_from_slice(b"--");
        want.extend_from_slice(&data[100..100 + ZC_CHUNK + 200]);
        let mut frames = 0;
        while let Some(b) = frame(&mut body) {
            frames += 1;
            write_all(&rt, &h, &tcp, b).expect("send");
        }
        assert_eq!(
            frames, 4,
            "10 bytes, the separator, a whole chunk, the rest"
        );
        // A stand-in with no piece queued for it is refused, not sent.
        let stray = stand_in().slice(..10);
        assert!(write_all(&rt, &h, &tcp, stray).is_err());
        drop(tcp);
        let got = reader.join().expect("reader");
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the bytes sent are the file's");
    }
}
