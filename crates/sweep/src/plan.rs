//! From an experiment to the runs it asks for: the cells of its matrix,
//! the order they run in, what is left after a resume, how long that will
//! take, and the command line of each run.
//!
//! Pure functions, so the order and the arithmetic are tested without a
//! network. The order interleaves: repetition 0 of every cell, then
//! repetition 1 of every cell, and so on, so that whatever the machine does
//! meanwhile (another job, a thermal step, a noisy neighbour) spreads over
//! all cells instead of landing on the repetitions of one. Phases run one
//! after the other, each interleaved within itself: a phase is a change of
//! the world (a link upgrade) and must not be mixed with the one before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fatpipe_schema::units;

use crate::experiment::{arg, Experiment, Param};

/// One cell: a combination of parameter values.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Index of its phase in [`Experiment::phases`].
    pub phase: usize,
    /// Every parameter (defaults, phase, matrix), with its line.
    pub params: BTreeMap<String, Param>,
    /// The stable key the archive files its runs under.
    pub key: String,
    /// The swept values only, for people: `window=1M mtu=9000`.
    pub label: String,
}

/// One run to do: a cell and a repetition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Index into the cell list.
    pub cell: usize,
    /// Repetition, from 0.
    pub repetition: u32,
}

/// Every cell of `e`, phase by phase, the matrix's last key varying fastest.
pub fn cells(e: &Experiment) -> Vec<Cell> {
    let mut out = Vec::new();
    for (pi, phase) in e.phases.iter().enumerate() {
        let mut combos: Vec<Vec<&crate::experiment::Level>> = vec![Vec::new()];
        for (_, levels) in &e.matrix {
            let mut next = Vec::with_capacity(combos.len() * levels.len());
            for c in &combos {
                for l in levels {
                    let mut c2 = c.clone();
                    c2.push(l);
                    next.push(c2);
                }
            }
            combos = next;
        }
        for combo in combos {
            let mut params = e.defaults.clone();
            for (k, v) in &phase.set {
                params.insert(k.clone(), v.clone());
            }
            let mut label = Vec::new();
            if !phase.name.is_empty() {
                label.push(format!("phase={}", phase.name));
            }
            for level in combo {
                for (k, v) in level {
                    params.insert(k.to_string(), v.clone());
                    label.push(format!("{k}={}", v.as_arg()));
                }
            }
            let key = cell_key(&phase.name, &params);
            out.push(Cell {
                phase: pi,
                params,
                key,
                label: if label.is_empty() {
                    "(one cell)".into()
                } else {
                    label.join(" ")
                },
            });
        }
    }
    out
}

/// The archive's key of a cell: every parameter's value and the phase,
/// canonical JSON, so the same cell gets the same key whatever order the
/// file lists things in, and changing any parameter makes a new cell.
pub fn cell_key(phase: &str, params: &BTreeMap<String, Param>) -> String {
    let mut map = serde_json::Map::new();
    for (k, v) in params {
        map.insert(k.clone(), v.value.clone());
    }
    if !phase.is_empty() {
        map.insert("phase".into(), serde_json::Value::from(phase));
    }
    fatpipe_archive::cell_key(&serde_json::Value::Object(map))
}

/// The parameters of a stored cell key (what [`cell_key`] wrote).
pub fn key_params(key: &str) -> BTreeMap<String, serde_json::Value> {
    match serde_json::from_str::<serde_json::Value>(key) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// The runs of `e` in the order they run, leaving out those in `done`
/// (cell key, repetition) — the runs the archive already holds.
pub fn schedule(e: &Experiment, cells: &[Cell], done: &BTreeSet<(String, u32)>) -> Vec<Planned> {
    let mut out = Vec::new();
    for phase in 0..e.phases.len() {
        for repetition in 0..e.repetitions {
            for (i, c) in cells.iter().enumerate() {
                if c.phase == phase && !done.contains(&(c.key.clone(), repetition)) {
                    out.push(Planned {
                        cell: i,
                        repetition,
                    });
                }
            }
        }
    }
    out
}

/// Fixed costs of one run beyond its measured time, as measured on the lab:
/// process start, connection, the server's session set-up and the end's
/// results exchange. The pre-flight probe of auto-tuning costs more.
const RUN_OVERHEAD: Duration = Duration::from_millis(700);
/// The pre-flight path probe of an auto-tuned test or copy.
const PREFLIGHT: Duration = Duration::from_secs(3);

/// What each `--find-max` trial costs beyond its length: a session's
/// set-up, the receivers' drain, the pause between trials.
const FIND_MAX_TRIAL_OVERHEAD: Duration = Duration::from_millis(600);
/// A `fatpipe path` probe with its defaults.
const PATH_PROBE: Duration = Duration::from_secs(6);

/// How long one run of `cell` should take: its measured time (or, for a
/// byte count or a copy, the bytes at the link's rate, or 1 Gbit/s when
/// unknown) plus the fixed costs.
pub fn estimate(cell: &Cell) -> Duration {
    let p = &cell.params;
    let get = |k: &str| arg(p, k);
    let command = get("command").unwrap_or_else(|| "test".into());
    let auto = get("auto").as_deref() != Some("false") && get("protocol").as_deref() != Some("udp");
    let rate = get("rate")
        .and_then(|r| units::parse_rate(&r).ok())
        .filter(|&r| r > 0)
        .unwrap_or(1_000_000_000) as f64;
    let rtt = get("rtt")
        .and_then(|r| units::parse_duration(&r).ok())
        .unwrap_or_default();
    let secs = |d: Option<String>, default: Duration| {
        d.and_then(|t| units::parse_duration(&t).ok())
            .unwrap_or(default)
    };
    let bytes_time = |bytes: u64| Duration::from_secs_f64(bytes as f64 * 8.0 / rate);
    let base = match command.as_str() {
        "path" => PATH_PROBE + rtt * 10,
        "copy" => {
            let size = get("size")
                .and_then(|s| units::parse_size(&s).ok())
                .unwrap_or(crate::run::DEFAULT_COPY_SIZE);
            bytes_time(size) + rtt * 20
        }
        _ => {
            let measured = match get("bytes").and_then(|b| units::parse_size(&b).ok()) {
                Some(b) => bytes_time(b),
                None => {
                    secs(get("time"), Duration::from_secs(10)) + secs(get("omit"), Duration::ZERO)
                }
            };
            if get("find_max").as_deref() == Some("true") {
                // A typical search: a dozen short trials, each a session
                // with its own set-up, then the confirming trial.
                let trial = secs(get("trial"), Duration::from_secs(1));
                measured + (trial + FIND_MAX_TRIAL_OVERHEAD + rtt * 4) * 12
            } else {
                measured + rtt * 4
            }
        }
    };
    let pre = if auto && command != "path" {
        PREFLIGHT
    } else {
        Duration::ZERO
    };
    base + pre + RUN_OVERHEAD
}

/// The total of [`estimate`] over `runs`.
pub fn total_estimate(cells: &[Cell], runs: &[Planned]) -> Duration {
    runs.iter().map(|r| estimate(&cells[r.cell])).sum()
}

/// What a run's command line needs to know about where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The server as `HOST:PORT`.
    pub server: String,
    /// The pre-shared key file.
    pub key_file: Option<String>,
    /// For copy cells: `SOURCE DEST` as the copy command takes them.
    pub copy_paths: Option<(String, String)>,
}

/// The `fatpipe` arguments of one run of `cell` (after the program name),
/// always with `--json`.
pub fn argv(cell: &Cell, end: &Endpoint) -> Vec<String> {
    let p = &cell.params;
    let get = |k: &str| arg(p, k);
    let command = get("command").unwrap_or_else(|| "test".into());
    let mut a: Vec<String> = vec![command.clone()];
    let flag = |name: &str, key: &str, a: &mut Vec<String>| {
        if let Some(v) = get(key) {
            a.push(name.into());
            a.push(v);
        }
    };
    match command.as_str() {
        "copy" => {
            let (src, dst) = end.copy_paths.clone().unwrap_or_default();
            let (host, port) = split_port(&end.server);
            if let Some(port) = port {
                a.extend(["-p".into(), port]);
            }
            a.push("-r".into());
            flag("-P", "streams", &mut a);
            if get("auto").as_deref() == Some("false") {
                a.push("--no-auto".into());
            }
            a.push(src.replace("{host}", &host));
            a.push(dst.replace("{host}", &host));
        }
        "path" => {
            a.push(end.server.clone());
            if get("direction").as_deref() == Some("down") {
                a.push("-R".into());
            }
        }
        _ => {
            a.push(end.server.clone());
            flag("-P", "streams", &mut a);
            flag("-w", "window", &mut a);
            flag("-M", "mss", &mut a);
            flag("-C", "congestion", &mut a);
            flag("--fq-rate", "fq_rate", &mut a);
            flag("-l", "length", &mut a);
            flag("-b", "bitrate", &mut a);
            flag("-t", "time", &mut a);
            flag("-O", "omit", &mut a);
            flag("-n", "bytes", &mut a);
            match get("direction").as_deref() {
                Some("down") => a.push("-R".into()),
                Some("bidir") => a.push("--bidir".into()),
                _ => {}
            }
            if get("protocol").as_deref() == Some("udp") {
                a.push("-u".into());
            }
            if get("auto").as_deref() == Some("false") {
                a.push("--no-auto".into());
            }
            if get("zerocopy").as_deref() == Some("true") {
                a.push("-Z".into());
            }
            if get("find_max").as_deref() == Some("true") {
                a.push("--find-max".into());
                flag("--loss-max", "loss_max", &mut a);
                flag("--trial", "trial", &mut a);
            }
            if get("no_batch").as_deref() == Some("true") {
                a.push("--no-batch".into());
            }
        }
    }
    if let Some(k) = &end.key_file {
        a.push("--key-file".into());
        a.push(k.clone());
    }
    a.push("--json".into());
    a
}

/// `host:port` → (`host`, `port`); `[v6]:port` too; no port → `None`
/// (the command's default).
fn split_port(server: &str) -> (String, Option<String>) {
    if let Some(rest) = server.strip_prefix('[') {
        if let Some((h, p)) = rest.split_once("]:") {
            return (format!("[{h}]"), Some(p.to_string()));
        }
        return (server.to_string(), None);
    }
    match server.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h.to_string(), Some(p.to_string()))
        }
        _ => (server.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn exp(text: &str) -> Experiment {
        Experiment::parse(Path::new("t.toml"), text).unwrap()
    }

    const TWO_BY_TWO: &str = "name = \"s\"\ntarget = \"lab\"\nrepetitions = 3\n\
        [defaults]\ntime = \"2s\"\nauto = false\n\
        [matrix]\nwindow = [\"64K\", \"1M\"]\nstreams = [1, 4]\n";

    #[test]
    fn cells_are_every_combination_with_stable_keys() {
        let e = exp(TWO_BY_TWO);
        let c = cells(&e);
        assert_eq!(c.len(), 4);
        let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(
            labels,
            vec![
                "streams=1 window=64K",
                "streams=1 window=1M",
                "streams=4 window=64K",
                "streams=4 window=1M"
            ]
        );
        // The same parameters in another order in the file: same keys.
        let e2 = exp(
            "name = \"s\"\ntarget = \"lab\"\n[matrix]\nstreams = [1, 4]\nwindow = [\"64K\", \"1M\"]\n\
             [defaults]\nauto = false\ntime = \"2s\"\n",
        );
        let k1: BTreeSet<String> = c.iter().map(|c| c.key.clone()).collect();
        let k2: BTreeSet<String> = cells(&e2).iter().map(|c| c.key.clone()).collect();
        assert_eq!(k1, k2);
        assert_eq!(
            key_params(&c[0].key)["window"],
            serde_json::Value::from("64K")
        );
    }

    #[test]
    fn the_schedule_interleaves_and_skips_what_is_done() {
        let e = exp(TWO_BY_TWO);
        let c = cells(&e);
        let all = schedule(&e, &c, &BTreeSet::new());
        assert_eq!(all.len(), 12);
        let first: Vec<(usize, u32)> = all[..5].iter().map(|p| (p.cell, p.repetition)).collect();
        assert_eq!(first, vec![(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]);
        let done: BTreeSet<(String, u32)> = [(c[1].key.clone(), 0), (c[0].key.clone(), 2)]
            .into_iter()
            .collect();
        let left = schedule(&e, &c, &done);
        assert_eq!(left.len(), 10);
        assert!(!left.iter().any(|p| p.cell == 1 && p.repetition == 0));
        assert!(!left.iter().any(|p| p.cell == 0 && p.repetition == 2));
    }

    #[test]
    fn phases_run_one_after_the_other() {
        let e = exp(
            "name = \"h\"\ntarget = \"lab\"\nrepetitions = 2\n[matrix]\nstreams = [1, 2]\n\
             [[phase]]\nname = \"a\"\nset = { rate = \"100M\" }\n\
             [[phase]]\nname = \"b\"\nset = { rate = \"622M\" }\n",
        );
        let c = cells(&e);
        let s = schedule(&e, &c, &BTreeSet::new());
        let phases: Vec<usize> = s.iter().map(|p| c[p.cell].phase).collect();
        assert_eq!(phases, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_ne!(c[0].key, c[2].key, "the phase is part of the key");
        assert_eq!(arg(&c[2].params, "rate").as_deref(), Some("622M"));
    }

    #[test]
    fn estimates_add_the_measured_time_and_fixed_costs() {
        let e = exp(TWO_BY_TWO);
        let c = cells(&e);
        assert_eq!(estimate(&c[0]), Duration::from_secs(2) + RUN_OVERHEAD);
        let e = exp(
            "name = \"c\"\ntarget = \"lab\"\n[defaults]\ncommand = \"copy\"\nsize = 125000000\n\
             rate = \"1G\"\nrtt = \"100ms\"\n",
        );
        // 1 s of data at 1 Gbit/s, 20 RTTs of start-up, a pre-flight.
        assert_eq!(
            estimate(&cells(&e)[0]),
            Duration::from_secs(1) + Duration::from_secs(2) + PREFLIGHT + RUN_OVERHEAD
        );
    }

    #[test]
    fn argv_maps_parameters_to_the_commands_flags() {
        let e = exp(
            "name = \"a\"\ntarget = \"lab\"\n[defaults]\nprotocol = \"udp\"\nbitrate = \"1G\"\n\
             length = 1472\ndirection = \"down\"\ntime = \"3s\"\n",
        );
        let end = Endpoint {
            server: "198.18.0.2:4000".into(),
            key_file: None,
            copy_paths: None,
        };
        assert_eq!(
            argv(&cells(&e)[0], &end).join(" "),
            "test 198.18.0.2:4000 -l 1472 -b 1G -t 3s -R -u --json"
        );
        let e = exp(
            "name = \"a\"\ntarget = \"lab\"\n[defaults]\nprotocol = \"udp\"\nlength = 64\n\
             find_max = true\ntrial = \"2s\"\nloss_max = \"0.1%\"\nno_batch = true\ntime = \"5s\"\n",
        );
        let c = &cells(&e)[0];
        assert_eq!(
            argv(c, &end).join(" "),
            "test 198.18.0.2:4000 -l 64 -t 5s -u --find-max --loss-max 0.1% --trial 2s \
             --no-batch --json"
        );
        // Twelve trials of 2 s and their set-up, then the 5 s confirmation.
        assert_eq!(
            estimate(c),
            Duration::from_secs(5)
                + (Duration::from_secs(2) + FIND_MAX_TRIAL_OVERHEAD) * 12
                + RUN_OVERHEAD
        );
        let e =
            exp("name = \"a\"\ntarget = \"lab\"\n[defaults]\ncommand = \"copy\"\nstreams = 4\n");
        let end = Endpoint {
            server: "198.18.0.2:4000".into(),
            key_file: Some("/k".into()),
            copy_paths: Some(("/data/set/".into(), "{host}:sweep/r1".into())),
        };
        assert_eq!(
            argv(&cells(&e)[0], &end).join(" "),
            "copy -p 4000 -r -P 4 /data/set/ 198.18.0.2:sweep/r1 --key-file /k --json"
        );
    }
}
