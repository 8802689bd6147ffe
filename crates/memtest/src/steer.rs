//! Steering a running test from the client (`Steer`): the adjuster's
//! actions (more streams, another congestion control) carried out with the
//! server, and what each cost.

use super::*;

pub(super) type LocalInterval = (Duration, Duration, bool, Vec<StreamSample>);

/// The client's end of in-flight changes.
pub(super) struct Steer<'a> {
    pub(super) adjust: Option<&'a mut dyn Adjust>,
    pub(super) session: Arc<ClientSession>,
    pub(super) pending: Option<Pending>,
    /// A change failed half-way: ask for no more.
    pub(super) off: bool,
    /// Socket settings of added streams, this end's and the server's.
    pub(super) local: Vec<schema::SocketInfo>,
    pub(super) remote: Vec<schema::SocketInfo>,
}

/// A change sent to the server and not yet answered.
pub(super) struct Pending {
    pub(super) change: Adjustment,
    /// `Some` for `AddStreams`.
    pub(super) add: Option<AddStreams>,
    /// Streams dialed (`AddStreams`), once the dialer is done.
    pub(super) dialed: Option<Vec<Stream>>,
    /// The server's `Adjusted` parts so far, and whether the last came.
    pub(super) reply: Vec<SocketSetup>,
    pub(super) replied: bool,
    pub(super) warnings: Vec<String>,
    pub(super) since: Instant,
}

impl Steer<'_> {
    /// After an interval: asks the adjuster, and starts what it wants.
    pub(super) fn on_interval(
        &mut self,
        side: &mut Side,
        control: &Control,
        iv: &schema::TestInterval,
    ) -> Result<()> {
        if self.off || self.pending.is_some() {
            return Ok(());
        }
        let Some(adjust) = self.adjust.as_mut() else {
            return Ok(());
        };
        let Some(change) = adjust.on_interval(iv) else {
            return Ok(());
        };
        if side.ending() {
            adjust.on_result(&change, Err("the test is ending".into()));
            return Ok(());
        }
        match &change {
            Adjustment::AddStreams(n) => self.start_add(side, control, change.clone(), *n),
            Adjustment::SetCongestion(name) => {
                let name = name.clone();
                self.start_congestion(side, control, change, &name)
            }
        }
    }

    pub(super) fn start_add(
        &mut self,
        side: &mut Side,
        control: &Control,
        change: Adjustment,
        n: u32,
    ) -> Result<()> {
        let p = &side.shared.params;
        let (up, down) = match p.direction {
            Direction::Up => (n, 0),
            Direction::Down => (0, n),
            Direction::Both => (n, n),
        };
        let add = AddStreams {
            first: side.streams.len() as u32,
            up,
            down,
        };
        let (up_now, down_now) = (side.count(Role::Send), side.count(Role::Recv));
        if let Err(why) = p.check_add(add.first, up_now, down_now, &add) {
            self.finish(&change, Err(why));
            return Ok(());
        }
        control.send(&TestMsg::AddStreams(add).encode())?;
        let session = Arc::clone(&self.session);
        let config = side.config.clone();
        let tx = side.tx.clone();
        let dialer = std::thread::Builder::new()
            .name("adding streams".into())
            .spawn(move || {
                let ids = client_roles(add.first..add.first + add.count(), |id| {
                    add.client_sends(id)
                });
                let _ = tx.send(Ev::Dialed(dial_tcp_streams(&session, &config, &ids)));
            });
        if let Err(e) = dialer {
            // The server times out waiting and refuses; nothing changes.
            self.off = true;
            self.finish(&change, Err(format!("start a dialing thread: {e}")));
            return Ok(());
        }
        self.pending = Some(Pending {
            change,
            add: Some(add),
            dialed: None,
            reply: Vec::new(),
            replied: false,
            warnings: Vec::new(),
            since: Instant::now(),
        });
        Ok(())
    }

    pub(super) fn start_congestion(
        &mut self,
        side: &mut Side,
        control: &Control,
        change: Adjustment,
        name: &str,
    ) -> Result<()> {
        if let Err(why) = check_congestion_name(name) {
            self.finish(&change, Err(why));
            return Ok(());
        }
        let (warnings, ok) = side.set_congestion(name);
        if !ok {
            self.finish(&change, Err(warnings.join("; ")));
            return Ok(());
        }
        if side.shared.params.direction == Direction::Up {
            let applied = applied(side, warnings);
            self.finish(&change, Ok(applied));
            return Ok(());
        }
        control.send(
            &TestMsg::SetCongestion {
                name: name.to_string(),
            }
            .encode(),
        )?;
        self.pending = Some(Pending {
            change,
            add: None,
            dialed: None,
            reply: Vec::new(),
            replied: false,
            warnings,
            since: Instant::now(),
        });
        Ok(())
    }

    /// The dialer of an `AddStreams` finished.
    pub(super) fn on_dialed(&mut self, side: &mut Side, dialed: Result<Vec<Dialed>>) -> Result<()> {
        let Some(pending) = self.pending.as_mut().filter(|p| p.add.is_some()) else {
            // A change already given up on: the sockets close here.
            return Ok(());
        };
        match dialed {
            Ok(d) => {
                let mut streams = Vec::with_capacity(d.len());
                for (stream, w) in d {
                    for line in w {
                        if !pending.warnings.contains(&line) {
                            pending.warnings.push(line);
                        }
                    }
                    streams.push(stream);
                }
                pending.dialed = Some(streams);
                self.complete(side)
            }
            Err(e) => {
                // The server may have some of them: ask for nothing more.
                self.off = true;
                if let Some(p) = self.pending.take() {
                    self.finish(&p.change, Err(format!("dialing the new streams: {e}")));
                }
                Ok(())
            }
        }
    }

    /// A part of the server's `Adjusted`.
    pub(super) fn on_adjusted(
        &mut self,
        side: &mut Side,
        streams: Vec<SocketSetup>,
        warnings: Vec<String>,
        refused: Option<String>,
        more: bool,
    ) -> Result<()> {
        let Some(pending) = self.pending.as_mut() else {
            return Ok(());
        };
        if let Some(why) = refused {
            if let Some(p) = self.pending.take() {
                self.finish(&p.change, Err(format!("server refused: {why}")));
            }
            return Ok(());
        }
        pending.reply.extend(streams);
        add_server_warnings(&mut pending.warnings, warnings);
        pending.replied = !more;
        self.complete(side)
    }

    /// Starts the added streams once both the dialer and the server are
    /// done; reports a finished switch.
    pub(super) fn complete(&mut self, side: &mut Side) -> Result<()> {
        let Some(pending) = self.pending.as_mut() else {
            return Ok(());
        };
        if !pending.replied || (pending.add.is_some() && pending.dialed.is_none()) {
            return Ok(());
        }
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        if let (Some(add), Some(streams)) = (p.add, p.dialed) {
            let up = |id: u32| add.client_sends(id);
            self.local
                .extend(streams.iter().map(|s| socket_info(&s.setup, up(s.id))));
            self.remote
                .extend(p.reply.iter().map(|s| socket_info(s, up(s.id))));
            side.add(streams)?;
        }
        let applied = applied(side, p.warnings);
        self.finish(&p.change, Ok(applied));
        Ok(())
    }

    /// Gives up on a change the server never answered.
    pub(super) fn check_timeout(&mut self) {
        let late = self
            .pending
            .as_ref()
            .is_some_and(|p| p.since.elapsed() > SETUP_TIMEOUT + Duration::from_secs(5));
        if late {
            self.off = true;
            if let Some(p) = self.pending.take() {
                self.finish(&p.change, Err("the server did not answer in time".into()));
            }
        }
    }

    pub(super) fn finish(
        &mut self,
        change: &Adjustment,
        result: std::result::Result<Applied, String>,
    ) {
        if let Some(a) = self.adjust.as_mut() {
            a.on_result(change, result);
        }
    }
}

/// What a change leaves: the time and streams per direction now.
pub(super) fn applied(side: &Side, warnings: Vec<String>) -> Applied {
    let (up, down) = (side.count(Role::Send), side.count(Role::Recv));
    Applied {
        at_s: side.shared.start().elapsed().as_secs_f64(),
        streams: match side.shared.params.direction {
            Direction::Up => up,
            Direction::Down => down,
            Direction::Both => up.max(down),
        },
        warnings,
    }
}
