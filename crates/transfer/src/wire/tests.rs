//! The wire format's tests: round trips, bounds and refusals of every message.

use super::*;

fn p(s: &str) -> RelPath {
    RelPath::new(s.as_bytes()).unwrap()
}

fn all_messages() -> Vec<Msg> {
    vec![
        Msg::Request(Request {
            version: VERSION,
            direction: Direction::Pull,
            recursive: true,
            sync: false,
            direct: true,
            algo: Algo::Blake3,
            streams: 8,
            chunk_size: 8 << 20,
            bwlimit: 1_000_000_000,
            export: b"data".to_vec(),
            paths: vec![b"a/b".to_vec(), b"../evil".to_vec()],
            tuning: SocketTuning {
                buffer: 4 << 20,
                force: true,
                congestion: "bbr".into(),
                pacing: 250_000_000,
                start_window: 1 << 20,
                start_ms: 2_500,
            },
        }),
        Msg::Accept(Accept {
            streams: 4,
            io: "sendfile".into(),
            max_streams: 256,
            congestion: "cubic".into(),
            congestion_allowed: vec!["reno".into(), "cubic".into(), "bbr".into()],
        }),
        Msg::Refuse(Refuse {
            class: RefuseClass::Usage,
            message: "no such export".into(),
        }),
        Msg::Entries(vec![
            Entry {
                path: p("d"),
                kind: EntryKind::Dir,
                mode: 0o755,
                mtime_s: -5,
                mtime_ns: 7,
            },
            Entry {
                path: p("d/f é"),
                kind: EntryKind::File {
                    size: 1 << 40,
                    sparse: true,
                },
                mode: 0o644,
                mtime_s: 1_700_000_000,
                mtime_ns: 999_999_999,
            },
            Entry {
                path: p("d/l"),
                kind: EntryKind::Symlink {
                    target: b"../../x".to_vec(),
                },
                mode: 0o777,
                mtime_s: 0,
                mtime_ns: 0,
            },
        ]),
        Msg::EntriesEnd { count: 3 },
        Msg::Need(vec![Need {
            file: 1,
            ranges: vec![(0, 3), (5, 6)],
        }]),
        Msg::NeedEnd,
        Msg::Resend { file: 1, chunk: 2 },
        Msg::FileFailed {
            file: 9,
            message: "gone".to_string().into(),
        },
        Msg::FileFailed {
            file: 10,
            message: crate::Reason {
                kind: crate::FailureKind::NoSpace {
                    on: "/data (xfs)".into(),
                },
                text: "no space left on /data (xfs)".into(),
            },
        },
        Msg::FileFailed {
            file: 11,
            message: crate::Reason {
                kind: crate::FailureKind::Permission,
                text: "permission denied".into(),
            },
        },
        Msg::Done(Summary {
            files_verified: 1,
            files_skipped: 2,
            files_failed: 3,
            bytes_written: 4,
            chunks_resent: 5,
            io: "pwrite".into(),
        }),
        Msg::Abort {
            message: "bye".into(),
        },
        Msg::AddStreams { n: 4 },
        Msg::StreamsAdded { n: 3 },
        Msg::SetCongestion { name: "bbr".into() },
        Msg::Stats(SenderStats {
            streams: 9,
            bytes_acked: 1 << 33,
            retransmits: 1234,
            rtt_us: 228_000,
            congestion: "bbr".into(),
        }),
        Msg::Notes(vec![
            Note {
                kind: NoteKind::Skipped,
                path: "d/fifo".into(),
                detail: "FIFO".into(),
            },
            Note {
                kind: NoteKind::HardLink,
                path: "d/b".into(),
                detail: "d/a".into(),
            },
            Note {
                kind: NoteKind::More,
                path: String::new(),
                detail: "7".into(),
            },
        ]),
    ]
}

#[test]
fn an_older_request_decodes_without_the_start_window() {
    let Some(Msg::Request(mut r)) = all_messages().into_iter().next() else {
        panic!("the first message is a request");
    };
    let mut buf = Vec::new();
    Msg::Request(r.clone()).encode(&mut buf);
    let v3 = buf.len();
    r.version = 2;
    buf.clear();
    Msg::Request(r.clone()).encode(&mut buf);
    // Version 2 ended after the pacing rate: no start window fields.
    assert_eq!(buf.len() + 12, v3);
    let Msg::Request(back) = Msg::decode(&buf[4..]).unwrap() else {
        panic!("not a request");
    };
    assert_eq!(back.version, 2);
    assert_eq!((back.tuning.start_window, back.tuning.start_ms), (0, 0));
    r.tuning.start_window = 0;
    r.tuning.start_ms = 0;
    assert_eq!(back, r);
}

#[test]
fn every_message_round_trips() {
    for m in all_messages() {
        let mut buf = Vec::new();
        m.encode(&mut buf);
        let len = u32::from_be_bytes(arr4(&buf)) as usize;
        assert_eq!(len + 4, buf.len());
        assert_eq!(Msg::decode(&buf[4..]).unwrap(), m);
        let back = read_msg(&mut &buf[..]).unwrap();
        assert_eq!(back, m);
        // Every strict prefix is refused, never panics.
        for cut in 0..buf.len() - 4 {
            assert!(Msg::decode(&buf[4..4 + cut]).is_err(), "{m:?} cut {cut}");
        }
    }
}

#[test]
fn refuses_bad_input() {
    assert_eq!(
        Msg::decode(&[99]),
        Err(WireError::Unknown {
            what: "message type",
            value: 99
        })
    );
    assert_eq!(Msg::decode(&[7, 0]), Err(WireError::Trailing));
    // A huge count with no bytes behind it does not allocate.
    assert!(matches!(
        Msg::decode(&[4, 0xff, 0xff, 0xff, 0xff]),
        Err(WireError::TooLarge(_))
    ));
    // Oversized frame refused before reading it.
    let big = ((MAX_FRAME + 1) as u32).to_be_bytes();
    let err = read_msg(&mut &big[..]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    // A congestion name longer than the kernel's is refused.
    let mut buf = Vec::new();
    Msg::SetCongestion {
        name: "x".repeat(MAX_CONGESTION_NAME + 1),
    }
    .encode(&mut buf);
    assert!(matches!(
        Msg::decode(&buf[4..]),
        Err(WireError::TooLarge(_))
    ));
    // An entry whose path climbs is refused by the decoder.
    let mut buf = Vec::new();
    let mut w = Writer(&mut buf);
    w.u8(4);
    w.u32(1);
    w.u8(2);
    w.u32(0o755);
    w.u64(0);
    w.u32(0);
    w.bytes(b"a/../../etc");
    assert!(matches!(Msg::decode(&buf), Err(WireError::Path(_))));
}

#[test]
fn chunk_header_round_trip_and_check() {
    let h = ChunkHeader {
        kind: ChunkKind::Data,
        file: 7,
        offset: 8 << 20,
        len: 4096,
    };
    let b = h.encode();
    assert_eq!(ChunkHeader::decode(&b).unwrap(), h);
    for i in 0..HEADER_LEN {
        let mut bad = b;
        bad[i] ^= 0x10;
        assert!(ChunkHeader::decode(&bad).is_err(), "byte {i}");
    }
    let mut huge = h;
    huge.len = MAX_CHUNK + 1;
    assert!(matches!(
        ChunkHeader::decode(&huge.encode()),
        Err(WireError::TooLarge(_))
    ));
    assert_eq!(Hello::decode(&Hello::Data.encode()).unwrap(), Hello::Data);
    assert_eq!(Hello::decode(&[0; 8]), Err(WireError::BadMagic));
}

#[test]
fn batching_stays_under_the_cap() {
    let entries: Vec<Entry> = (0..20_000)
        .map(|i| Entry {
            path: p(&format!("dir/{}/{}", "x".repeat(200), i)),
            kind: EntryKind::File {
                size: i,
                sparse: false,
            },
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
        })
        .collect();
    let msgs = entries_messages(&entries);
    assert!(msgs.len() > 1);
    let mut back = Vec::new();
    for m in msgs {
        let mut buf = Vec::new();
        m.encode(&mut buf);
        assert!(buf.len() - 4 <= MAX_FRAME);
        match Msg::decode(&buf[4..]).unwrap() {
            Msg::Entries(e) => back.extend(e),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(back, entries);
}
