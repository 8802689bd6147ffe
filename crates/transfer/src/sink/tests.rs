//! The sink's tests: chunks written, verified and journaled on a real file system.

use super::*;
use crate::journal::Journal;

fn entry(path: &str, kind: EntryKind, mtime_s: i64) -> Entry {
    Entry {
        path: RelPath::new(path.as_bytes()).unwrap(),
        kind,
        mode: 0o644,
        mtime_s,
        mtime_ns: 0,
    }
}

fn opts() -> SinkOptions {
    SinkOptions {
        chunk_size: 4096,
        algo: Algo::Xxh3,
        sync: false,
        direct: false,
        max_resends: 5,
        window: None,
        start: None,
    }
}

#[test]
fn prepare_skips_complete_files_and_resumes_journaled_chunks() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    std::fs::create_dir(base.join("d")).unwrap();
    // "done": already complete (same size and mtime) -> skipped.
    std::fs::write(base.join("d/done"), [1u8; 100]).unwrap();
    let f = std::fs::File::options()
        .write(true)
        .open(base.join("d/done"))
        .unwrap();
    beneath::set_file_mtime(&f, 1000, 0).unwrap();
    // "half": 3 chunks, an earlier run verified chunks 0 and 2 (chunk 2
    // then got damaged on disk, so only chunk 0 still counts).
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let dir = Dir::open(&base.join("d")).unwrap();
    let part = dir
        .open_at(&part_name(b"half"), OFlags::RDWR | OFlags::CREATE, 0o600)
        .unwrap();
    part.write_all_at(&data, 0).unwrap();
    part.write_all_at(b"X", 9000).unwrap();
    let id = Identity {
        size: 10_000,
        mtime_s: 2000,
        mtime_ns: 0,
        chunk_size: 4096,
        algo: Algo::Xxh3,
    };
    let mut j = Journal::create(&dir, &journal_name(b"half"), &id).unwrap();
    j.record(0, &Algo::Xxh3.digest(0, &data[..4096])).unwrap();
    j.record(2, &Algo::Xxh3.digest(8192, &data[8192..]))
        .unwrap();
    drop((j, part));
    // An earlier carry-over to another chunk size crashed before its
    // rename: the resume at the journal's own size removes what it left.
    let leftover = crate::journal::replacement_name(&journal_name(b"half"));
    std::fs::write(
        base.join("d")
            .join(String::from_utf8_lossy(&leftover).as_ref()),
        b"x",
    )
    .unwrap();

    let entries = vec![
        entry("d", EntryKind::Dir, 0),
        entry(
            "d/done",
            EntryKind::File {
                size: 100,
                sparse: false,
            },
            1000,
        ),
        entry(
            "d/half",
            EntryKind::File {
                size: 10_000,
                sparse: false,
            },
            2000,
        ),
        entry(
            "d/empty",
            EntryKind::File {
                size: 0,
                sparse: false,
            },
            3000,
        ),
        entry("d/new dir", EntryKind::Dir, 0),
        entry(
            "d/link",
            EntryKind::Symlink {
                target: b"../elsewhere".to_vec(),
            },
            0,
        ),
    ];
    let progress = Arc::new(Progress::default());
    let (sink, needs) = Sink::prepare(
        Dir::open(base).unwrap(),
        entries,
        opts(),
        Arc::clone(&progress),
    )
    .unwrap();
    assert_eq!(
        needs,
        vec![Need {
            file: 2,
            ranges: vec![(1, 3)]
        }]
    );
    let s = sink.summary();
    assert_eq!(
        (s.files_skipped, s.files_verified),
        (1, 1),
        "empty file finished at once"
    );
    assert!(base.join("d/empty").exists());
    assert!(base.join("d/new dir").is_dir());
    assert_eq!(
        std::fs::read_link(base.join("d/link")).unwrap().as_os_str(),
        "../elsewhere"
    );
    assert!(
        !base.join("d/half").exists(),
        "incomplete file under its final name"
    );
    assert!(!base
        .join("d")
        .join(String::from_utf8_lossy(&leftover).as_ref())
        .exists());
    assert_eq!(progress.bytes.load(Ordering::Relaxed), 100 + 4096);
    assert!(!sink.is_complete());
}

#[test]
fn resume_carries_a_journal_of_another_chunk_size_over() {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let file = |size| EntryKind::File {
        size,
        sparse: false,
    };
    /// An earlier run's journal, and what this session at 4096 makes
    /// of it.
    struct Case {
        old: u32,
        verified: &'static [u32],
        damage: usize,
        needs: Vec<(u32, u32)>,
        kept: Vec<u32>,
    }
    let cases = [
        // Larger old chunks: [0,8192) verified covers new 0 and 1; the
        // damaged [8192,10000) covers nothing.
        Case {
            old: 8192,
            verified: &[0, 1],
            damage: 9000,
            needs: vec![(2, 3)],
            kept: vec![0, 1],
        },
        // Smaller old chunks: new chunk 1 ([4096,8192)) needs old 2 and
        // 3; 3 was damaged, so only chunks 0 and 2 are kept.
        Case {
            old: 2048,
            verified: &[0, 1, 2, 3, 4],
            damage: 7000,
            needs: vec![(1, 2)],
            kept: vec![0, 2],
        },
        // Sizes that do not divide: [0,3000) [3000,6000) [6000,9000)
        // [9000,10000), the second damaged: new 0 needs old 0 and 1.
        Case {
            old: 3000,
            verified: &[0, 1, 2, 3],
            damage: 4000,
            needs: vec![(0, 2)],
            kept: vec![2],
        },
    ];
    for Case {
        old,
        verified,
        damage,
        needs: needs_want,
        kept,
    } in cases
    {
        let t = tempfile::tempdir().unwrap();
        let base = t.path();
        let dir = Dir::open(base).unwrap();
        let part = dir
            .open_at(&part_name(b"f"), OFlags::RDWR | OFlags::CREATE, 0o600)
            .unwrap();
        part.write_all_at(&data, 0).unwrap();
        let id = Identity {
            size: 10_000,
            mtime_s: 2000,
            mtime_ns: 0,
            chunk_size: old,
            algo: Algo::Xxh3,
        };
        let mut j = Journal::create(&dir, &journal_name(b"f"), &id).unwrap();
        for &c in verified {
            let (off, len) = chunk_range(10_000, old, c).unwrap();
            let bytes = &data[off as usize..(off + u64::from(len)) as usize];
            j.record(c, &Algo::Xxh3.digest(off, bytes)).unwrap();
        }
        part.write_all_at(b"X", damage as u64).unwrap();
        drop((j, part));
        let (_sink, needs) = Sink::prepare(
            Dir::open(base).unwrap(),
            vec![entry("f", file(10_000), 2000)],
            opts(),
            Arc::new(Progress::default()),
        )
        .unwrap();
        assert_eq!(
            needs,
            vec![Need {
                file: 0,
                ranges: needs_want
            }],
            "old chunk {old}"
        );
        // The journal now counts in this session's chunks, with digests
        // of this size's cut.
        let now = Identity {
            chunk_size: 4096,
            ..id
        };
        let got = Journal::load(&dir, &journal_name(b"f"), &now)
            .unwrap()
            .unwrap();
        assert_eq!(got.chunk_size, 4096);
        let want: Vec<(u32, Digest)> = kept
            .iter()
            .map(|&c| {
                let (off, len) = chunk_range(10_000, 4096, c).unwrap();
                let bytes = &data[off as usize..(off + u64::from(len)) as usize];
                (c, Algo::Xxh3.digest(off, bytes))
            })
            .collect();
        assert_eq!(got.records, want, "old chunk {old}");
    }
}

#[test]
fn prepare_refuses_duplicate_paths_and_reports_blocked_parents() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), t.path().join("evil")).unwrap();
    let dup = vec![
        entry(
            "a",
            EntryKind::File {
                size: 1,
                sparse: false,
            },
            0,
        ),
        entry(
            "a",
            EntryKind::File {
                size: 1,
                sparse: false,
            },
            0,
        ),
    ];
    assert!(Sink::prepare(Dir::open(t.path()).unwrap(), dup, opts(), Arc::default()).is_err());
    // A file beneath a symlink that leads out fails alone, nothing written outside.
    let entries = vec![
        entry(
            "evil/x",
            EntryKind::File {
                size: 0,
                sparse: false,
            },
            0,
        ),
        entry(
            "ok",
            EntryKind::File {
                size: 0,
                sparse: false,
            },
            0,
        ),
    ];
    let (sink, needs) = Sink::prepare(
        Dir::open(t.path()).unwrap(),
        entries,
        opts(),
        Arc::default(),
    )
    .unwrap();
    assert!(needs.is_empty());
    let failures = sink.failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].path, "evil/x");
    assert!(t.path().join("ok").exists());
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    assert!(sink.is_complete());
}
