//! One HTTP connection, from accept to close, on the engine's thread for it.
//!
//! A current-thread tokio runtime of the connection's own drives hyper's
//! HTTP/1.1 server over the socket (TLS first when the port is HTTPS);
//! beside it a watchdog tick enforces what the engine asks of a front end:
//! - before the first request is admitted, the TLS handshake and the
//!   request head must arrive by the pre-auth deadline (`Conn::deadline`,
//!   counted from accept), or the connection is closed and the timeout
//!   counted in the log summary;
//! - the first request makes the connection a session of service `http`
//!   (`Conn::admit_session`: the server's session caps, the Observer,
//!   refused while draining: 503 with the reason);
//! - a connection idle (no byte read or written) for `Limits::idle` is
//!   closed, whatever it was doing: a stalled upload, download or an idle
//!   keep-alive;
//! - on SIGTERM hyper is told to finish the request in flight and close;
//!   the drain's abort shuts the socket.
//!
//! On plain HTTP, file bodies are zero copy: they hand their file pieces
//! to the socket wrapper through a [`Handoff`], which sends them with
//! `sendfile(2)` (body.rs says how). That needs hyper's vectored "queue"
//! write strategy (body frames passed on as they are, never copied into
//! its own buffer), which the builder is told to use.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::net::{Shutdown as NetShutdown, TcpStream as StdTcp};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fatpipe_engine::logsum::Event;
use fatpipe_engine::{Conn, Outcome, Session};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::archive::Transfer;
use crate::body::{Body, Handoff};
use crate::Config;

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(200);

/// What the request handlers share about their connection.
pub(crate) struct Shared {
    pub(crate) cfg: Arc<Config>,
    pub(crate) conn: RefCell<Conn>,
    pub(crate) session: RefCell<Option<Session>>,
    /// Whether the connection's first request was admitted.
    pub(crate) admitted: Cell<bool>,
    pub(crate) aborted: Arc<AtomicBool>,
    abort_socket: Option<Arc<StdTcp>>,
    /// The send buffer forced for large bodies on a long path (given back
    /// to the server-wide budget when the connection ends).
    forced: RefCell<crate::sndbuf::Forced>,
}

impl Shared {
    /// Makes the connection a session at its first request; the refusal's
    /// text otherwise.
    pub(crate) fn admit(&self) -> Result<(), String> {
        if self.admitted.get() {
            return Ok(());
        }
        let session = self
            .conn
            .borrow_mut()
            .admit_session(crate::SERVICE)
            .map_err(|r| r.reason)?;
        let aborted = Arc::clone(&self.aborted);
        let socket = self.abort_socket.clone();
        session.on_abort(move |_| {
            aborted.store(true, Ordering::Release);
            if let Some(s) = &socket {
                let _ = s.shutdown(NetShutdown::Both);
            }
        });
        *self.session.borrow_mut() = Some(session);
        self.admitted.set(true);
        Ok(())
    }

    /// The session's report (bytes to the Observer), once admitted.
    pub(crate) fn report(&self) -> Option<fatpipe_engine::Report> {
        self.session.borrow().as_ref().map(|s| s.report().clone())
    }

    /// One line to the server's log (escaped by the engine).
    pub(crate) fn log(&self, line: &str) {
        let conn = self.conn.borrow();
        conn.log(&format!("http {}: {line}", conn.peer()));
    }
}

/// Serves one accepted connection to its end.
pub(crate) fn serve(cfg: Arc<Config>, tcp: StdTcp, conn: Conn) {
    let _ = tcp.set_nodelay(true);
    let abort_socket = tcp.try_clone().ok().map(Arc::new);
    if tcp.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    else {
        return;
    };
    let shared = Rc::new(Shared {
        cfg,
        conn: RefCell::new(conn),
        session: RefCell::new(None),
        admitted: Cell::new(false),
        aborted: Arc::new(AtomicBool::new(false)),
        abort_socket,
        forced: RefCell::default(),
    });
    let ended = rt.block_on(run(Rc::clone(&shared), tcp));
    let session = shared.session.borrow_mut().take();
    if let Some(s) = session {
        s.finish(if ended { Outcome::Ok } else { Outcome::Failed });
    }
}

/// Why the watchdog ended a connection.
enum Cut {
    Preauth,
    Idle,
    Aborted,
}

/// Returns whether the connection ended cleanly.
async fn run(sh: Rc<Shared>, tcp: StdTcp) -> bool {
    let Ok(tcp) = TcpStream::from_std(tcp) else {
        return false;
    };
    let deadline = sh.conn.borrow().deadline();
    let last = Rc::new(Cell::new(Instant::now()));
    let io = match &sh.cfg.tls {
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(tls));
            let at = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(at, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => Io::Tls(Box::new(s)),
                Ok(Err(_)) => {
                    sh.conn.borrow().summarise(Event::HandshakeFailed);
                    return false;
                }
                Err(_) => {
                    sh.conn.borrow().summarise(Event::PreauthTimeout);
                    return false;
                }
            }
        }
        None => Io::Plain(tcp),
    };
    let handoff = matches!(io, Io::Plain(_)).then(|| Rc::new(Handoff::default()));
    let io = Activity {
        io,
        last: Rc::clone(&last),
        handoff: handoff.clone(),
    };
    let limits = sh.cfg.limits;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_buf.max(8192))
        .max_headers(limits.max_headers)
        .keep_alive(true);
    if handoff.is_some() {
        // Zero copy needs body frames passed to the socket as they are.
        builder.writev(true);
    }
    let svc_shared = Rc::clone(&sh);
    let svc = hyper::service::service_fn(move |req| {
        let asked = svc_shared.cfg.archive.clone().map(|sink| Asked {
            sink,
            method: req.method().clone(),
            path: req.uri().path().chars().take(1024).collect(),
            peer: svc_shared.conn.borrow().peer(),
            t0: Instant::now(),
        });
        let answer = crate::handler::handle(Rc::clone(&svc_shared), req);
        let handoff = handoff.clone();
        let sh = Rc::clone(&svc_shared);
        async move {
            let mut resp = answer.await?;
            if resp.body().is_file() {
                if let Some(sock) = &sh.abort_socket {
                    crate::sndbuf::widen(sock, resp.body().len(), &mut sh.forced.borrow_mut());
                }
            }
            if let Some(a) = asked {
                resp = a.record(resp);
            }
            Ok::<_, std::convert::Infallible>(match &handoff {
                Some(h) => resp.map(|b| b.zero_copy(h)),
                None => resp,
            })
        }
    });
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    let mut connection = std::pin::pin!(connection);
    let mut tick = tokio::time::interval(TICK);
    let mut graceful = false;
    let outcome = std::future::poll_fn(|cx: &mut Context<'_>| {
        if let Poll::Ready(r) = connection.as_mut().poll(cx) {
            return Poll::Ready(Ok(r.is_ok()));
        }
        while tick.poll_tick(cx).is_ready() {
            let now = Instant::now();
            if sh.aborted.load(Ordering::Acquire) {
                return Poll::Ready(Err(Cut::Aborted));
            }
            if !sh.admitted.get() && now >= deadline {
                return Poll::Ready(Err(Cut::Preauth));
            }
            if sh.admitted.get() && now.duration_since(last.get()) >= limits.idle {
                return Poll::Ready(Err(Cut::Idle));
            }
            if !graceful && sh.conn.borrow().shutdown().is_set() {
                graceful = true;
                connection.as_mut().graceful_shutdown();
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    })
    .await;
    match outcome {
        Ok(clean) => clean,
        Err(Cut::Preauth) => {
            sh.conn.borrow().summarise(Event::PreauthTimeout);
            false
        }
        Err(Cut::Idle) => {
            sh.log(&format!(
                "closed after {} s without traffic",
                limits.idle.as_secs()
            ));
            false
        }
        Err(Cut::Aborted) => false,
    }
}

/// A request whose file transfer goes to the archive hook.
struct Asked {
    sink: crate::archive::Sink,
    method: hyper::Method,
    path: String,
    peer: std::net::SocketAddr,
    t0: Instant,
}

impl Asked {
    /// Records a `PUT` that wrote a file now, a `GET` of a file when its
    /// body ends; other answers are not transfers.
    fn record(self, resp: hyper::Response<Body>) -> hyper::Response<Body> {
        let status = resp.status().as_u16();
        let transfer = move |method, bytes, complete| Transfer {
            method,
            path: self.path,
            peer: self.peer,
            status,
            bytes,
            seconds: self.t0.elapsed().as_secs_f64(),
            finished: std::time::SystemTime::now(),
            complete,
        };
        let sink = self.sink.clone();
        if self.method == hyper::Method::PUT {
            if let Some(w) = resp.extensions().get::<crate::archive::Written>() {
                sink.record(transfer("PUT", w.0, true));
            }
            resp
        } else if self.method == hyper::Method::GET
            && matches!(status, 200 | 206)
            && resp.body().is_file()
        {
            resp.map(|b| {
                b.on_end(move |sent, complete| sink.record(transfer("GET", sent, complete)))
            })
        } else {
            resp
        }
    }
}

/// The socket, plain or TLS.
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// The socket, noting when a byte last moved either way; on plain HTTP
/// it sends zero-copy bodies' stand-in frames from their files.
struct Activity {
    io: Io,
    last: Rc<Cell<Instant>>,
    handoff: Option<Rc<Handoff>>,
}

impl Activity {
    fn moved<T>(&self, r: &Poll<io::Result<T>>, progressed: bool) {
        if matches!(r, Poll::Ready(Ok(_))) && progressed {
            self.last.set(Instant::now());
        }
    }
}

impl AsyncRead for Activity {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        let progressed = buf.filled().len() > before;
        this.moved(&r, progressed);
        r
    }
}

impl AsyncWrite for Activity {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match (&mut this.io, &this.handoff) {
            (Io::Plain(s), Some(h)) if Handoff::is_stand_in(data) => h.send(cx, s, data),
            (Io::Plain(s), _) => Pin::new(s).poll_write(cx, data),
            (Io::Tls(s), _) => Pin::new(s.as_mut()).poll_write(cx, data),
        };
        let progressed = matches!(r, Poll::Ready(Ok(n)) if n > 0);
        this.moved(&r, progressed);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match (&mut this.io, &this.handoff) {
            // Ordinary bytes before a stand-in go out first, by themselves.
            (Io::Plain(s), Some(h)) => match Handoff::first_stand_in(bufs) {
                Some(k) if bufs[..k].iter().all(|b| b.is_empty()) => h.send(cx, s, &bufs[k]),
                Some(k) => Pin::new(s).poll_write_vectored(cx, &bufs[..k]),
                None => Pin::new(s).poll_write_vectored(cx, bufs),
            },
            (Io::Plain(s), None) => Pin::new(s).poll_write_vectored(cx, bufs),
            (Io::Tls(s), _) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        let progressed = matches!(r, Poll::Ready(Ok(n)) if n > 0);
        this.moved(&r, progressed);
        r
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
