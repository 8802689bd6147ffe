//! The experiment file: what a sweep measures, against what, how often,
//! and the source document's own figures to compare with.
//!
//! An experiment is a TOML file (format in docs/sweep.md). Parsing is two
//! steps, both before anything runs: serde reads the file's shape (unknown
//! keys, wrong types), then every parameter value is checked the way the
//! command that will receive it checks it (`fatpipe_schema::units`), and
//! every cell's combination of parameters is checked for contradictions
//! (UDP with a congestion control, a lab key against a remote server).
//! Every error is one line naming the file, the line and the key at fault
//! ([`SweepError::File`]), which is why values are read as
//! [`toml::Spanned`]: a parameter keeps the line it was written on through
//! the matrix expansion.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use fatpipe_schema::units;
use serde::Deserialize;
use toml::Spanned;

use crate::error::SweepError;

/// Repetitions per cell when the file does not say.
pub const DEFAULT_REPETITIONS: u32 = 3;
/// Most repetitions per cell a file may ask for.
pub const MAX_REPETITIONS: u32 = 1000;
/// Most cells one experiment may expand to: a guard against a matrix typed
/// with one value too many per key, which would run for weeks.
pub const MAX_CELLS: usize = 10_000;

/// A parsed, checked experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    /// The file it came from (for messages).
    pub file: PathBuf,
    /// The sweep's name in the archive: rerunning the file resumes it.
    pub name: String,
    /// A title for reports.
    pub title: Option<String>,
    /// The source document it reproduces (`000`, `004`), if any.
    pub seed: Option<String>,
    /// Where the runs go.
    pub target: Target,
    /// The archive's path key for its runs.
    pub path: String,
    /// Repetitions of every cell.
    pub repetitions: u32,
    /// Phases run one after the other (one unnamed phase when the file has
    /// none); each runs the whole matrix.
    pub phases: Vec<Phase>,
    /// Parameters every cell has unless the matrix or a phase sets them.
    pub defaults: BTreeMap<String, Param>,
    /// The swept dimensions, sorted by name: every combination of their
    /// levels is a cell. A dimension is a parameter and its values, or a
    /// named list of parameter bundles (`mode = [{ protocol = "tcp" },
    /// { protocol = "udp", bitrate = "1G" }]`) for parameters that only
    /// make sense together.
    pub matrix: Vec<(String, Vec<Level>)>,
    /// How `fatpipe report` lays out this experiment by default.
    pub report: ReportSpec,
    /// The source document's own figures.
    pub seed_figures: Vec<SeedFigure>,
}

/// Where the sweep's runs go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An emulated link that the sweep brings up itself (needs root).
    Lab,
    /// A running `fatpipe server`.
    Server {
        /// HOST, HOST:PORT or [IPv6]:PORT as the commands take it.
        host: String,
        /// The pre-shared key file, if the server wants one.
        key_file: Option<PathBuf>,
        /// The server's export that `copy` cells write to and read from.
        export: Option<String>,
    },
}

/// One level of a matrix dimension: the parameters it sets (one for a
/// plain list, several for a bundle).
pub type Level = BTreeMap<String, Param>;

/// One parameter value and the line of the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The value as written: a string, integer, float or boolean.
    pub value: serde_json::Value,
    /// 1-based line in the experiment file.
    pub line: usize,
}

/// A phase: the matrix run once more with some parameters changed, after
/// the phases before it, optionally with a dated note on the path (the
/// link upgrade of a before/after study).
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Its name, part of every cell key of the phase (empty for the one
    /// implicit phase of a file without phases).
    pub name: String,
    /// An annotation put on the path when the phase starts.
    pub annotate: Option<String>,
    /// Parameters it sets for all its cells (over the defaults, under the
    /// matrix).
    pub set: BTreeMap<String, Param>,
}

/// `[report]`: the default table of `fatpipe report EXPERIMENT`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportSpec {
    /// Parameter down the rows.
    pub rows: Option<String>,
    /// Parameter across the columns.
    pub columns: Option<String>,
    /// Parameters that split the table into several (one per protocol).
    pub split: Vec<String>,
    /// Which measure: `throughput`, `retransmits`, `rtt`, `loss`, `jitter`,
    /// `cpu`.
    pub metric: Option<String>,
    /// Which statistic: `median`, `mean`, `p10`, `p90`, `min`, `max`.
    pub stat: Option<String>,
}

/// One figure from the source document, to show beside fatpipe's.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedFigure {
    /// The parameters of the cells it compares with (a subset: every cell
    /// matching them is pooled).
    pub cell: BTreeMap<String, serde_json::Value>,
    /// Which measure.
    pub metric: String,
    /// Which statistic of the runs.
    pub stat: String,
    /// When set, the figure is a ratio: the statistic over `cell` divided
    /// by the same over these cells ("a factor of 2 after the upgrade").
    pub ratio_to: Option<BTreeMap<String, serde_json::Value>>,
    /// The seed's value in the metric's base unit (bit/s, µs, percent),
    /// or the ratio itself.
    pub value: f64,
    /// Where in the document it is, as the document says it.
    pub source: String,
    /// Said alongside, e.g. how the rate was scaled to this lab.
    pub note: Option<String>,
}

/// What a parameter is and where it may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One of a fixed set of words.
    Word(&'static [&'static str]),
    /// A whole number in a range.
    Int(i64, i64),
    /// A byte size (`64K`, `256M`).
    Size,
    /// A rate (`1gbit`, `622M`).
    Rate,
    /// A duration (`10s`, `93ms`).
    Duration,
    /// A probability (`0.1%`, `1e-4`).
    Probability,
    /// A queue limit (`1bdp`, `50ms`, `16MB`, `unlimited`).
    Queue,
    /// `true` or `false`.
    Bool,
    /// Free text (a congestion control's name).
    Text,
    /// A positive number.
    Float,
}

/// Which targets a parameter applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Any target.
    Any,
    /// Only an emulated link that the sweep brings up.
    Lab,
}

/// The commands a parameter applies to (a bit set).
const TEST: u8 = 1;
/// See [`TEST`].
const COPY: u8 = 2;
/// See [`TEST`].
const PATH: u8 = 4;
/// See [`TEST`].
const ALL: u8 = TEST | COPY | PATH;

/// Every parameter a cell may have: name, kind, scope, the commands it
/// applies to, what it means.
const PARAMS: &[(&str, Kind, Scope, u8, &str)] = &[
    (
        "command",
        Kind::Word(&["test", "copy", "path"]),
        Scope::Any,
        ALL,
        "the command each run is",
    ),
    (
        "protocol",
        Kind::Word(&["tcp", "udp"]),
        Scope::Any,
        TEST,
        "TCP or UDP",
    ),
    (
        "direction",
        Kind::Word(&["up", "down", "bidir"]),
        Scope::Any,
        ALL,
        "client sends, server sends (-R, a pull), or both",
    ),
    ("streams", Kind::Int(1, 1024), Scope::Any, TEST | COPY, "-P"),
    ("window", Kind::Size, Scope::Any, TEST, "-w, socket buffers"),
    ("mss", Kind::Int(88, 65535), Scope::Any, TEST, "-M"),
    ("congestion", Kind::Text, Scope::Any, TEST, "-C"),
    ("fq_rate", Kind::Rate, Scope::Any, TEST, "--fq-rate"),
    ("length", Kind::Size, Scope::Any, TEST, "-l"),
    ("bitrate", Kind::Rate, Scope::Any, TEST, "-b (UDP)"),
    ("time", Kind::Duration, Scope::Any, TEST, "-t"),
    ("omit", Kind::Duration, Scope::Any, TEST, "-O"),
    ("bytes", Kind::Size, Scope::Any, TEST, "-n"),
    (
        "auto",
        Kind::Bool,
        Scope::Any,
        TEST | COPY,
        "false gives --no-auto",
    ),
    ("zerocopy", Kind::Bool, Scope::Any, TEST, "-Z"),
    (
        "find_max",
        Kind::Bool,
        Scope::Any,
        TEST,
        "--find-max (UDP): throughput is the loss-free rate",
    ),
    (
        "loss_max",
        Kind::Probability,
        Scope::Any,
        TEST,
        "--loss-max (with find_max)",
    ),
    (
        "trial",
        Kind::Duration,
        Scope::Any,
        TEST,
        "--trial: find_max's searching trials",
    ),
    (
        "no_batch",
        Kind::Bool,
        Scope::Any,
        TEST,
        "--no-batch (UDP): a datagram per system call",
    ),
    ("size", Kind::Size, Scope::Any, COPY, "the dataset's size"),
    (
        "files",
        Kind::Int(1, 1_000_000),
        Scope::Any,
        COPY,
        "files in the dataset",
    ),
    (
        "rtt",
        Kind::Duration,
        Scope::Lab,
        ALL,
        "lab round-trip time",
    ),
    ("rate", Kind::Rate, Scope::Lab, ALL, "lab bottleneck rate"),
    (
        "loss",
        Kind::Probability,
        Scope::Lab,
        ALL,
        "lab random loss",
    ),
    (
        "loss_burst",
        Kind::Float,
        Scope::Lab,
        ALL,
        "lab mean loss burst",
    ),
    (
        "jitter",
        Kind::Duration,
        Scope::Lab,
        ALL,
        "lab delay variation",
    ),
    ("queue", Kind::Queue, Scope::Lab, ALL, "lab queue limit"),
    ("mtu", Kind::Int(576, 65535), Scope::Lab, ALL, "lab MTU"),
    (
        "overhead",
        Kind::Int(0, 1000),
        Scope::Lab,
        ALL,
        "lab per-packet framing charged at the bottleneck [38, Ethernet]",
    ),
    (
        "tuning",
        Kind::Word(&["default", "tuned"]),
        Scope::Lab,
        ALL,
        "the namespace's default sysctls, or `fatpipe tune --apply`'s for the link",
    ),
];

/// The metrics a report or a seed figure may name.
pub const METRICS: &[&str] = &[
    "throughput",
    "retransmits",
    "rtt_min",
    "rtt",
    "rtt_max",
    "rtt_std",
    "loss",
    "jitter",
    "cpu_local",
    "cpu_remote",
];
/// The statistics a report or a seed figure may name.
pub const STATS: &[&str] = &["median", "mean", "p10", "p90", "min", "max", "stddev", "n"];

impl Experiment {
    /// Reads and checks `file`.
    pub fn load(file: &Path) -> Result<Experiment, SweepError> {
        let text = std::fs::read_to_string(file).map_err(|e| SweepError::Read {
            file: file.to_path_buf(),
            source: e,
        })?;
        Experiment::parse(file, &text)
    }

    /// Parses and checks `text` as if read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Experiment, SweepError> {
        let err = |span: Option<Range<usize>>, key: &str, msg: String| SweepError::File {
            file: file.to_path_buf(),
            line: span.map(|s| line_of(text, s.start)),
            key: key.to_string(),
            message: msg,
        };
        let raw: RawExperiment = toml::from_str(text).map_err(|e| {
            let (key, msg) = split_toml_message(e.message());
            err(e.span(), &key, msg)
        })?;

        let name = raw.name.get_ref().trim().to_string();
        if name.is_empty() || name.len() > 100 || name.chars().any(char::is_control) {
            return Err(err(
                Some(raw.name.span()),
                "name",
                "give the sweep a name of 1 to 100 printable characters".into(),
            ));
        }
        let target_text = raw.target.get_ref().trim().to_string();
        let target = if target_text == "lab" {
            if let Some(k) = &raw.key_file {
                return Err(err(
                    Some(k.span()),
                    "key_file",
                    "a lab target needs no key".into(),
                ));
            }
            Target::Lab
        } else if target_text.is_empty() {
            return Err(err(
                Some(raw.target.span()),
                "target",
                "give \"lab\" or a server's HOST[:PORT]".into(),
            ));
        } else {
            Target::Server {
                host: target_text.clone(),
                key_file: raw.key_file.as_ref().map(|k| PathBuf::from(k.get_ref())),
                export: raw.export.as_ref().map(|e| e.get_ref().clone()),
            }
        };
        let path = match &raw.path {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(err(Some(p.span()), "path", "must not be empty".into()))
            }
            Some(p) => p.get_ref().trim().to_string(),
            None => match &target {
                Target::Lab => format!("lab:{name}"),
                Target::Server { host, .. } => format!("{}→{}", local_host_name(), host_only(host)),
            },
        };
        let repetitions = match &raw.repetitions {
            None => DEFAULT_REPETITIONS,
            Some(r) => {
                let n = *r.get_ref();
                if n < 1 || n > i64::from(MAX_REPETITIONS) {
                    return Err(err(
                        Some(r.span()),
                        "repetitions",
                        format!("must be 1..={MAX_REPETITIONS}"),
                    ));
                }
                n as u32
            }
        };

        let ctx = Ctx {
            text,
            file,
            lab: target == Target::Lab,
        };
        let defaults = ctx.params("defaults", &raw.defaults)?;
        let mut matrix = Vec::new();
        for (key, values) in &raw.matrix {
            let k = key.get_ref();
            let list = match values.get_ref() {
                toml::Value::Array(items) => items,
                _ => {
                    return Err(err(
                        Some(values.span()),
                        &format!("matrix.{k}"),
                        "must be a list of values, e.g. [1, 2, 4]".into(),
                    ))
                }
            };
            if list.is_empty() {
                return Err(err(
                    Some(values.span()),
                    &format!("matrix.{k}"),
                    "an empty list gives no cells".into(),
                ));
            }
            let line = line_of(text, values.span().start);
            let mut out = Vec::with_capacity(list.len());
            for v in list {
                let mut level = Level::new();
                match v {
                    toml::Value::Table(bundle) => {
                        if bundle.is_empty() {
                            return Err(err(
                                Some(values.span()),
                                &format!("matrix.{k}"),
                                "an empty bundle sets nothing".into(),
                            ));
                        }
                        for (bk, bv) in bundle {
                            level.insert(
                                bk.clone(),
                                ctx.param(&format!("matrix.{k}.{bk}"), bk, bv, line)?,
                            );
                        }
                    }
                    v => {
                        level.insert(k.clone(), ctx.param(&format!("matrix.{k}"), k, v, line)?);
                    }
                }
                out.push(level);
            }
            matrix.push((k.clone(), out));
        }
        let mut phases = Vec::new();
        for (i, p) in raw.phase.iter().enumerate() {
            let pname = p.name.get_ref().trim().to_string();
            if pname.is_empty() {
                return Err(err(
                    Some(p.name.span()),
                    &format!("phase[{i}].name"),
                    "must not be empty".into(),
                ));
            }
            if phases.iter().any(|q: &Phase| q.name == pname) {
                return Err(err(
                    Some(p.name.span()),
                    &format!("phase[{i}].name"),
                    format!("a phase named '{pname}' comes earlier"),
                ));
            }
            let set = ctx.params(&format!("phase[{i}].set"), &p.set)?;
            for k in set.keys() {
                if matrix
                    .iter()
                    .any(|(_, levels)| levels.iter().any(|l| l.contains_key(k)))
                {
                    return Err(err(
                        Some(p.name.span()),
                        &format!("phase[{i}].set.{k}"),
                        "is swept by [matrix] too; a phase may set only what the matrix does not"
                            .into(),
                    ));
                }
            }
            phases.push(Phase {
                name: pname,
                annotate: p.annotate.clone(),
                set,
            });
        }
        if phases.is_empty() {
            phases.push(Phase {
                name: String::new(),
                annotate: None,
                set: BTreeMap::new(),
            });
        }
        let report = match &raw.report {
            None => ReportSpec::default(),
            Some(r) => ctx.report(r)?,
        };
        let mut seed_figures = Vec::new();
        for (i, f) in raw.seed_figure.iter().enumerate() {
            seed_figures.push(ctx.seed_figure(i, f)?);
        }

        let exp = Experiment {
            file: file.to_path_buf(),
            name,
            title: raw.title.clone(),
            seed: raw.seed.clone(),
            target,
            path,
            repetitions,
            phases,
            defaults,
            matrix,
            report,
            seed_figures,
        };
        let cells = exp.count_cells();
        if cells > MAX_CELLS {
            return Err(err(
                None,
                "matrix",
                format!("expands to {cells} cells; at most {MAX_CELLS}"),
            ));
        }
        for cell in crate::plan::cells(&exp) {
            ctx.check_cell(&cell.params, &exp.target)?;
        }
        Ok(exp)
    }

    /// Number of cells: the product of the matrix's list lengths, times
    /// the phases.
    pub fn count_cells(&self) -> usize {
        self.matrix
            .iter()
            .fold(self.phases.len(), |n, (_, v)| n.saturating_mul(v.len()))
    }

    /// The names of the swept parameters.
    pub fn swept(&self) -> Vec<&str> {
        self.matrix.iter().map(|(k, _)| k.as_str()).collect()
    }
}

impl Param {
    /// The value as the command line takes it.
    pub fn as_arg(&self) -> String {
        match &self.value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

/// The value of `key` as a command-line argument from a cell's parameters.
pub fn arg(params: &BTreeMap<String, Param>, key: &str) -> Option<String> {
    params.get(key).map(Param::as_arg)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: Spanned<String>,
    title: Option<String>,
    seed: Option<String>,
    target: Spanned<String>,
    path: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    export: Option<Spanned<String>>,
    repetitions: Option<Spanned<i64>>,
    #[serde(default)]
    defaults: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    matrix: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    phase: Vec<RawPhase>,
    report: Option<RawReport>,
    #[serde(default)]
    seed_figure: Vec<RawSeedFigure>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    name: Spanned<String>,
    annotate: Option<String>,
    #[serde(default)]
    set: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReport {
    rows: Option<Spanned<String>>,
    columns: Option<Spanned<String>>,
    #[serde(default)]
    split: Vec<Spanned<String>>,
    metric: Option<Spanned<String>>,
    stat: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSeedFigure {
    #[serde(default)]
    cell: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    ratio_to: Option<BTreeMap<Spanned<String>, Spanned<toml::Value>>>,
    metric: Spanned<String>,
    #[serde(default)]
    stat: Option<Spanned<String>>,
    value: Spanned<toml::Value>,
    source: String,
    note: Option<String>,
}

/// What the checks need: the text (for line numbers), the file, the target.
struct Ctx<'a> {
    text: &'a str,
    file: &'a Path,
    lab: bool,
}

impl Ctx<'_> {
    fn err(&self, line: Option<usize>, key: &str, message: String) -> SweepError {
        SweepError::File {
            file: self.file.to_path_buf(),
            line,
            key: key.to_string(),
            message,
        }
    }

    fn params(
        &self,
        table: &str,
        raw: &BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    ) -> Result<BTreeMap<String, Param>, SweepError> {
        let mut out = BTreeMap::new();
        for (k, v) in raw {
            let line = line_of(self.text, v.span().start);
            let key = k.get_ref();
            out.insert(
                key.clone(),
                self.param(&format!("{table}.{key}"), key, v.get_ref(), line)?,
            );
        }
        Ok(out)
    }

    /// Checks one value of parameter `name` (`key` is its full name for
    /// messages) and keeps its line.
    fn param(
        &self,
        key: &str,
        name: &str,
        v: &toml::Value,
        line: usize,
    ) -> Result<Param, SweepError> {
        let e = |msg: String| self.err(Some(line), key, msg);
        let Some(&(_, kind, scope, ..)) = PARAMS.iter().find(|(n, ..)| *n == name) else {
            let known: Vec<&str> = PARAMS.iter().map(|p| p.0).collect();
            return Err(e(format!("unknown parameter; known: {}", known.join(", "))));
        };
        if scope == Scope::Lab && !self.lab {
            return Err(e(
                "is a lab link parameter; it needs target = \"lab\"".into()
            ));
        }
        let value = match (kind, v) {
            (Kind::Bool, toml::Value::Boolean(b)) => serde_json::Value::Bool(*b),
            (Kind::Bool, _) => return Err(e("must be true or false".into())),
            (Kind::Int(lo, hi), toml::Value::Integer(i)) => {
                if *i < lo || *i > hi {
                    return Err(e(format!("must be {lo}..={hi}")));
                }
                serde_json::Value::from(*i)
            }
            (Kind::Int(..), _) => return Err(e("must be a whole number".into())),
            (Kind::Float, toml::Value::Float(f)) if f.is_finite() && *f > 0.0 => {
                serde_json::Value::from(*f)
            }
            (Kind::Float, toml::Value::Integer(i)) if *i > 0 => serde_json::Value::from(*i),
            (Kind::Float, _) => return Err(e("must be a number above 0".into())),
            (Kind::Word(words), toml::Value::String(s)) => {
                if !words.contains(&s.as_str()) {
                    return Err(e(format!("'{s}' is not one of {}", words.join(", "))));
                }
                serde_json::Value::from(s.clone())
            }
            (Kind::Word(words), _) => {
                return Err(e(format!("must be one of {}", words.join(", "))))
            }
            (Kind::Text, toml::Value::String(s)) => {
                if s.is_empty() || s.len() > 64 || !s.chars().all(|c| c.is_ascii_graphic()) {
                    return Err(e("must be a name like \"cubic\"".into()));
                }
                serde_json::Value::from(s.clone())
            }
            (Kind::Text, _) => return Err(e("must be a string".into())),
            (kind, v) => {
                // Quantities: a string with a unit, or a plain number
                // (bytes, bit/s, a probability); checked by the parser the
                // command itself uses.
                let text = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    _ => return Err(e("must be a quantity such as \"64K\" or \"10s\"".into())),
                };
                let checked = match kind {
                    Kind::Size => units::parse_size(&text)
                        .map(|_| ())
                        .map_err(|x| x.to_string()),
                    Kind::Rate => {
                        if text.eq_ignore_ascii_case("unlimited") {
                            Ok(())
                        } else {
                            units::parse_rate(&text)
                                .map(|_| ())
                                .map_err(|x| x.to_string())
                        }
                    }
                    Kind::Duration => units::parse_duration(&text)
                        .map(|_| ())
                        .map_err(|x| x.to_string()),
                    Kind::Probability => units::parse_probability(&text)
                        .map(|_| ())
                        .map_err(|x| x.to_string()),
                    Kind::Queue => fatpipe_lab::QueueSpec::parse(&text)
                        .map(|_| ())
                        .map_err(|x| x.to_string()),
                    _ => Ok(()),
                };
                checked.map_err(e)?;
                serde_json::Value::from(text)
            }
        };
        Ok(Param { value, line })
    }

    fn report(&self, r: &RawReport) -> Result<ReportSpec, SweepError> {
        let name = |s: &Spanned<String>, key: &str| -> Result<String, SweepError> {
            let v = s.get_ref();
            if v != "phase" && !PARAMS.iter().any(|p| p.0 == v) {
                return Err(self.err(
                    Some(line_of(self.text, s.span().start)),
                    key,
                    format!("'{v}' is not a parameter"),
                ));
            }
            Ok(v.clone())
        };
        let one_of = |s: &Spanned<String>, key: &str, set: &[&str]| -> Result<String, SweepError> {
            let v = s.get_ref();
            if !set.contains(&v.as_str()) {
                return Err(self.err(
                    Some(line_of(self.text, s.span().start)),
                    key,
                    format!("'{v}' is not one of {}", set.join(", ")),
                ));
            }
            Ok(v.clone())
        };
        Ok(ReportSpec {
            rows: r
                .rows
                .as_ref()
                .map(|s| name(s, "report.rows"))
                .transpose()?,
            columns: r
                .columns
                .as_ref()
                .map(|s| name(s, "report.columns"))
                .transpose()?,
            split: r
                .split
                .iter()
                .map(|s| name(s, "report.split"))
                .collect::<Result<_, _>>()?,
            metric: r
                .metric
                .as_ref()
                .map(|s| one_of(s, "report.metric", METRICS))
                .transpose()?,
            stat: r
                .stat
                .as_ref()
                .map(|s| one_of(s, "report.stat", STATS))
                .transpose()?,
        })
    }

    fn seed_figure(&self, i: usize, f: &RawSeedFigure) -> Result<SeedFigure, SweepError> {
        let key = |k: &str| format!("seed_figure[{i}].{k}");
        let metric = f.metric.get_ref().clone();
        let mline = line_of(self.text, f.metric.span().start);
        if !METRICS.contains(&metric.as_str()) {
            return Err(self.err(
                Some(mline),
                &key("metric"),
                format!("'{metric}' is not one of {}", METRICS.join(", ")),
            ));
        }
        let stat = match &f.stat {
            None => "median".to_string(),
            Some(s) if STATS.contains(&s.get_ref().as_str()) => s.get_ref().clone(),
            Some(s) => {
                return Err(self.err(
                    Some(line_of(self.text, s.span().start)),
                    &key("stat"),
                    format!("'{}' is not one of {}", s.get_ref(), STATS.join(", ")),
                ))
            }
        };
        let vline = line_of(self.text, f.value.span().start);
        let value = if f.ratio_to.is_some() {
            match f.value.get_ref() {
                toml::Value::Float(x) if *x > 0.0 => *x,
                toml::Value::Integer(i) if *i > 0 => *i as f64,
                _ => {
                    return Err(self.err(
                        Some(vline),
                        &key("value"),
                        "with ratio_to, the value is a ratio above 0 (2.0 for twice)".into(),
                    ))
                }
            }
        } else {
            seed_value(&metric, f.value.get_ref())
                .map_err(|m| self.err(Some(vline), &key("value"), m))?
        };
        let cell = self.seed_cell(i, "cell", &f.cell)?;
        let ratio_to = f
            .ratio_to
            .as_ref()
            .map(|r| self.seed_cell(i, "ratio_to", r))
            .transpose()?;
        Ok(SeedFigure {
            cell,
            metric,
            stat,
            ratio_to,
            value,
            source: f.source.clone(),
            note: f.note.clone(),
        })
    }

    /// The parameters a seed figure names (`phase` included), checked.
    fn seed_cell(
        &self,
        i: usize,
        table: &str,
        raw: &BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    ) -> Result<BTreeMap<String, serde_json::Value>, SweepError> {
        let mut cell = BTreeMap::new();
        for (k, v) in raw {
            let line = line_of(self.text, v.span().start);
            let name = k.get_ref();
            let full = format!("seed_figure[{i}].{table}.{name}");
            let value = if name == "phase" {
                match v.get_ref() {
                    toml::Value::String(s) => serde_json::Value::from(s.clone()),
                    _ => return Err(self.err(Some(line), &full, "must be a phase's name".into())),
                }
            } else {
                self.param(&full, name, v.get_ref(), line)?.value
            };
            cell.insert(name.clone(), value);
        }
        Ok(cell)
    }

    /// The checks that need a whole cell: contradictions between its
    /// parameters, reported at the line of the parameter that cannot be.
    fn check_cell(&self, p: &BTreeMap<String, Param>, target: &Target) -> Result<(), SweepError> {
        let text = |k: &str| p.get(k).map(Param::as_arg);
        let at = |k: &str| p.get(k).map(|x| x.line);
        let command = text("command").unwrap_or_else(|| "test".into());
        let udp = text("protocol").as_deref() == Some("udp");
        let fail = |k: &str, msg: &str| Err(self.err(at(k), k, msg.to_string()));
        let (bit, what) = match command.as_str() {
            "copy" => (COPY, "a copy"),
            "path" => (PATH, "a path probe"),
            _ => (TEST, "a test"),
        };
        for k in p.keys() {
            if let Some((.., uses, _)) = PARAMS.iter().find(|x| x.0 == k) {
                if uses & bit == 0 {
                    return fail(k, &format!("does not apply to {what}"));
                }
            }
        }
        match command.as_str() {
            "test" => {
                if udp {
                    for k in ["mss", "congestion", "zerocopy", "fq_rate"] {
                        if p.contains_key(k) {
                            return fail(k, "does not apply to UDP");
                        }
                    }
                    if text("auto").as_deref() == Some("true") {
                        return fail("auto", "auto-tuning applies to TCP only");
                    }
                } else if p.contains_key("bitrate") {
                    return fail("bitrate", "applies to UDP; for TCP use fq_rate");
                }
                if p.contains_key("bytes") && p.contains_key("time") {
                    return fail("bytes", "give time or bytes, not both");
                }
                let find_max = text("find_max").as_deref() == Some("true");
                for k in ["find_max", "no_batch"] {
                    if !udp && text(k).as_deref() == Some("true") {
                        return fail(k, "applies to UDP (protocol = \"udp\")");
                    }
                }
                for k in ["loss_max", "trial"] {
                    if !find_max && p.contains_key(k) {
                        return fail(k, "applies with find_max = true");
                    }
                }
                if find_max {
                    if p.contains_key("bytes") {
                        return fail("bytes", "find_max runs for a time, not a byte count");
                    }
                    if text("direction").as_deref() == Some("bidir") {
                        return fail("direction", "find_max searches one direction");
                    }
                }
            }
            "copy" => {
                if text("direction").as_deref() == Some("bidir") {
                    return fail("direction", "a copy goes one way: up (push) or down (pull)");
                }
                if let Target::Server { export: None, .. } = target {
                    return Err(self.err(
                        at("command"),
                        "export",
                        "copy cells against a server need `export = \"NAME\"` (the server's export to write to)".into(),
                    ));
                }
            }
            _ => {
                if text("direction").as_deref() == Some("bidir") {
                    return fail("direction", "a path probe goes one way: up or down (-R)");
                }
            }
        }
        Ok(())
    }
}

/// A seed's figure in the metric's base unit: throughput as a rate
/// (`"800M"` or bit/s), RTT as a duration (`"88.5ms"`), the rest as numbers.
fn seed_value(metric: &str, v: &toml::Value) -> Result<f64, String> {
    let num = match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    };
    let text = match v {
        toml::Value::String(s) => Some(s.as_str()),
        _ => None,
    };
    match (metric, num, text) {
        ("throughput", Some(n), _) => Ok(n),
        ("throughput", _, Some(t)) => units::parse_rate(t)
            .map(|r| r as f64)
            .map_err(|e| e.to_string()),
        (m, _, Some(t)) if m.starts_with("rtt") => units::parse_duration(t)
            .map(|d| d.as_secs_f64() * 1e6)
            .map_err(|e| e.to_string()),
        (m, Some(n), _) if m.starts_with("rtt") => Ok(n),
        (_, Some(n), _) => Ok(n),
        _ => Err("must be a number, or for throughput a rate like \"800M\"".into()),
    }
}

/// 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Splits toml's message into the key it names (`unknown field `foo``,
/// `missing field `name``) and a message of one line.
fn split_toml_message(msg: &str) -> (String, String) {
    let first = msg.lines().next().unwrap_or(msg).trim().to_string();
    let key = first
        .split('`')
        .nth(1)
        .map(str::to_string)
        .unwrap_or_default();
    (key, first)
}

/// HOST of HOST, HOST:PORT or [v6]:PORT: a path key is the same whatever
/// port the server listens on (as `fatpipe test --archive` keys it).
fn host_only(server: &str) -> &str {
    if let Some(rest) = server.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match server.split_once(':') {
        Some((h, p)) if !p.contains(':') => h,
        _ => server,
    }
}

/// This host's name, for a default path key.
fn local_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Experiment, SweepError> {
        Experiment::parse(Path::new("x.toml"), text)
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("parsed: {text}"),
            Err(e) => e.to_string(),
        }
    }

    const GOOD: &str = r#"
name = "000-window-mtu"
title = "window × MTU"
seed = "000"
target = "lab"
repetitions = 2

[defaults]
rtt = "228ms"
rate = "1gbit"
time = "5s"
auto = false

[matrix]
window = ["64K", "1M", "16M"]
mtu = [1500, 9000]
protocol = ["tcp"]

[report]
rows = "window"
columns = "mtu"
split = ["protocol"]
metric = "throughput"

[[seed_figure]]
cell = { mtu = 9000, window = "16M" }
metric = "throughput"
value = "800M"
source = "Table 3"
"#;

    #[test]
    fn a_good_file_parses_into_its_cells() {
        let e = parse(GOOD).unwrap();
        assert_eq!(e.name, "000-window-mtu");
        assert_eq!(e.target, Target::Lab);
        assert_eq!(e.path, "lab:000-window-mtu");
        assert_eq!(e.repetitions, 2);
        assert_eq!(e.count_cells(), 6);
        assert_eq!(e.swept(), vec!["mtu", "protocol", "window"]);
        assert_eq!(e.defaults["rtt"].line, 9);
        assert_eq!(e.report.rows.as_deref(), Some("window"));
        assert_eq!(e.seed_figures[0].value, 800e6);
        assert_eq!(e.seed_figures[0].stat, "median");
    }

    #[test]
    fn bad_files_get_one_line_with_file_line_and_key() {
        let cases: &[(&str, &str)] = &[
            ("name = \"a\"\ntarget = \"lab\"\nbogus = 1\n", "x.toml:3: bogus:"),
            ("target = \"lab\"\n", "x.toml:1: name: missing field"),
            (
                "name = \"a\"\ntarget = \"lab\"\n[matrix]\nwindow = [\"64Q\"]\n",
                "x.toml:4: matrix.window:",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\n[matrix]\nwindow = \"64K\"\n",
                "x.toml:4: matrix.window: must be a list",
            ),
            (
                "name = \"a\"\ntarget = \"h:1\"\n[defaults]\nrtt = \"10ms\"\n",
                "x.toml:4: defaults.rtt: is a lab link parameter",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\n[defaults]\nstreams = 0\n",
                "x.toml:4: defaults.streams: must be 1..=1024",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\n[defaults]\nwarp = 9\n",
                "x.toml:4: defaults.warp: unknown parameter",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\n[defaults]\nprotocol = \"udp\"\n\ncongestion = \"bbr\"\n",
                "x.toml:6: congestion: does not apply to UDP",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\nrepetitions = 0\n",
                "x.toml:3: repetitions: must be 1..=1000",
            ),
            (
                "name = \"a\"\ntarget = \"h\"\n[defaults]\ncommand = \"copy\"\n",
                "x.toml:4: export:",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\n[report]\nrows = \"colour\"\n",
                "x.toml:4: report.rows: 'colour' is not a parameter",
            ),
            (
                "name = \"a\"\ntarget = \"lab\"\n[matrix]\nrate = [\"1G\"]\n[[phase]]\nname = \"p\"\nset = { rate = \"2G\" }\n",
                "x.toml:6: phase[0].set.rate: is swept by [matrix] too",
            ),
            ("name = \"a\"\ntarget = \"lab\"\n[matrix\n", "x.toml:3:"),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(
                got.starts_with(want),
                "{text:?}\n got {got:?}\nwant {want:?}"
            );
            assert!(!got.contains('\n'), "more than one line: {got:?}");
        }
    }

    #[test]
    fn a_matrix_too_large_is_refused_before_anything_runs() {
        let many: Vec<String> = (1..=101).map(|i| i.to_string()).collect();
        let text = format!(
            "name = \"a\"\ntarget = \"lab\"\n[matrix]\nstreams = [{0}]\nfiles = [{0}]\n",
            many.join(",")
        );
        assert!(err(&text).contains("10201 cells"));
    }

    #[test]
    fn phases_multiply_cells_and_keep_their_notes() {
        let e = parse(
            "name = \"h\"\ntarget = \"lab\"\n[matrix]\nstreams = [1, 2]\n\
             [[phase]]\nname = \"oc3\"\nset = { rate = \"100M\" }\n\
             [[phase]]\nname = \"oc12\"\nannotate = \"upgraded\"\nset = { rate = \"622M\" }\n",
        )
        .unwrap();
        assert_eq!(e.count_cells(), 4);
        assert_eq!(e.phases[1].annotate.as_deref(), Some("upgraded"));
    }

    #[test]
    fn bundles_set_parameters_that_belong_together() {
        let e = parse(
            "name = \"b\"\ntarget = \"lab\"\n[matrix]\nwindow = [\"64K\", \"1M\"]\n\
             mode = [{ protocol = \"tcp\" }, { protocol = \"udp\", bitrate = \"1G\", length = 1470 }]\n",
        )
        .unwrap();
        assert_eq!(e.count_cells(), 4);
        assert_eq!(e.matrix[0].0, "mode");
        assert_eq!(e.matrix[0].1[1].len(), 3);
        // A bundle is checked like any parameter, at its line and key.
        let bad = err("name = \"b\"\ntarget = \"lab\"\n[matrix]\n\
             mode = [{ protocol = \"tcp\", bitrate = \"1G\" }]\n");
        assert!(
            bad.starts_with("x.toml:4: bitrate: applies to UDP"),
            "{bad}"
        );
        let bad = err("name = \"b\"\ntarget = \"lab\"\n[matrix]\nmode = [{ colour = 1 }]\n");
        assert!(
            bad.starts_with("x.toml:4: matrix.mode.colour: unknown parameter"),
            "{bad}"
        );
    }

    #[test]
    fn find_max_and_no_batch_are_udp_test_parameters() {
        let e = parse(
            "name = \"p\"\ntarget = \"lab\"\n[defaults]\nprotocol = \"udp\"\ntrial = \"2s\"\n\
             loss_max = \"0.1%\"\nfind_max = true\n[matrix]\nno_batch = [false, true]\n",
        )
        .unwrap();
        assert_eq!(e.count_cells(), 2);
        for (text, want) in [
            (
                "name = \"p\"\ntarget = \"lab\"\n[defaults]\nfind_max = true\n",
                "x.toml:4: find_max: applies to UDP",
            ),
            (
                "name = \"p\"\ntarget = \"lab\"\n[defaults]\nprotocol = \"udp\"\ntrial = \"1s\"\n",
                "x.toml:5: trial: applies with find_max = true",
            ),
            (
                "name = \"p\"\ntarget = \"lab\"\n[defaults]\nprotocol = \"udp\"\nfind_max = true\n\
                 direction = \"bidir\"\n",
                "x.toml:6: direction: find_max searches one direction",
            ),
        ] {
            let got = err(text);
            assert!(got.starts_with(want), "{got}");
        }
    }

    #[test]
    fn a_server_target_gets_a_host_path_key() {
        let e = parse("name = \"r\"\ntarget = \"dtn2:5202\"\n").unwrap();
        assert!(e.path.ends_with("→dtn2"), "{}", e.path);
        assert_eq!(host_only("[2001:2::2]:4000"), "2001:2::2");
        assert!(matches!(e.target, Target::Server { .. }));
    }

    #[test]
    fn every_seed_experiment_in_the_repository_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let e = Experiment::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                e.seed.is_some(),
                "{}: name its source document",
                path.display()
            );
            assert!(
                !e.seed_figures.is_empty(),
                "{}: store the seed's figures",
                path.display()
            );
            assert!(
                e.report.rows.is_some(),
                "{}: lay out its table",
                path.display()
            );
            n += 1;
        }
        assert!(n >= 4, "experiments/ holds {n} files");
    }

    #[test]
    fn seed_values_take_units() {
        assert_eq!(
            seed_value("throughput", &toml::Value::String("87M".into())),
            Ok(87e6)
        );
        assert_eq!(
            seed_value("rtt", &toml::Value::String("88.5ms".into())),
            Ok(88_500.0)
        );
        assert_eq!(seed_value("loss", &toml::Value::Float(0.5)), Ok(0.5));
        assert!(seed_value("throughput", &toml::Value::Boolean(true)).is_err());
    }
}
