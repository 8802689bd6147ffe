//! `fatpipe server --config FILE`: the server's settings from a TOML file.
//!
//! Every key is the long name of a server flag (`max-sessions = 64`,
//! `export = ["data=/srv/data:ro"]`, `metrics = "127.0.0.1:9301"`), so the
//! file can never fall behind the flags: a flag added to the server is a key
//! at once, with the same parser, default and `--help` text. The file is
//! turned into flags inserted before the command line's own, and a flag
//! given on the command line wins over the file's key (a repeatable flag
//! such as `--export` replaces the file's whole list). Secrets stay in
//! files of their own: every key that names one (`key-file`, `tls-key`,
//! `iperf3-rsa-private-key`) takes a path, as its flag does.
//!
//! Each key is checked on its own against the server's parser before
//! anything binds, so an error is one line naming the file, the line and the
//! key: `server.toml:7: max-sessions: invalid value 'many' …`, exit 2.
//! `--print-config` prints the effective settings (defaults, file, command
//! line, each marked) as a file the server reads back; defaults are
//! commented out, so they stay defaults when it does.

use std::ffi::OsString;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};
use toml::de::{DeTable, DeValue};

/// The largest configuration file read (a server's is a page or two).
const MAX_FILE: u64 = 1 << 20;

/// Flags of the server that are not settings, so have no key.
const NOT_KEYS: [&str; 4] = ["config", "print-config", "help", "version"];

/// What to do after the configuration file was read.
pub enum Expanded {
    /// Parse and run these arguments.
    Run(Vec<OsString>),
    /// `--print-config`: print this and exit 0.
    Print(String),
}

/// A configuration file that cannot be used: one line, exit 2.
#[derive(Debug)]
pub struct ConfigError {
    file: PathBuf,
    line: Option<usize>,
    key: Option<String>,
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// True when `argv` is a `fatpipe server` command line that names a
/// configuration file or asks for `--print-config`: only then is there
/// anything for [`expand`] to do, so no other command pays for a second
/// parse at start-up.
pub fn wanted(argv: &[OsString]) -> bool {
    argv.get(1).is_some_and(|a| a == "server")
        && argv.iter().skip(2).any(|a| {
            let a = a.as_encoded_bytes();
            a.starts_with(b"--config") || a == b"--print-config"
        })
}

/// Reads `fatpipe server --config FILE` into flags; any other command line
/// is returned as it is (clap reports its own errors when it parses it).
pub fn expand(argv: Vec<OsString>, cli: &Command) -> Result<Expanded, ConfigError> {
    let Ok(top) = cli.clone().try_get_matches_from(&argv) else {
        return Ok(Expanded::Run(argv));
    };
    let Some(("server", given)) = top.subcommand() else {
        return Ok(Expanded::Run(argv));
    };
    let Some(server) = cli.find_subcommand("server") else {
        return Ok(Expanded::Run(argv));
    };
    let print = given.get_flag("print_config");
    let mut from_file = Vec::new();
    if let Some(file) = given.get_one::<PathBuf>("config") {
        let text = read(file)?;
        from_file = flags(file, &text, cli, server, given)?;
    }
    let file_keys: Vec<String> = from_file.iter().map(|(k, _)| k.clone()).collect();
    // The file's flags go right after `server`, before the command line's.
    let at = argv
        .iter()
        .position(|a| a == "server")
        .map_or(argv.len(), |i| i + 1);
    let mut out: Vec<OsString> = argv[..at].to_vec();
    out.extend(
        from_file
            .into_iter()
            .flat_map(|(_, f)| f)
            .map(OsString::from),
    );
    out.extend(argv[at..].iter().cloned());
    if !print {
        return Ok(Expanded::Run(out));
    }
    let file = PathBuf::from("the command line");
    let matches = cli
        .clone()
        .try_get_matches_from(&out)
        .map_err(|e| ConfigError {
            file,
            line: None,
            key: None,
            message: clap_line(&e),
        })?;
    let Some(("server", m)) = matches.subcommand() else {
        return Ok(Expanded::Run(out));
    };
    Ok(Expanded::Print(print_config(server, m, given, &file_keys)))
}

fn read(file: &Path) -> Result<String, ConfigError> {
    let err = |message: String| ConfigError {
        file: file.to_path_buf(),
        line: None,
        key: None,
        message,
    };
    let meta = std::fs::metadata(file).map_err(|e| err(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(err("not a regular file".into()));
    }
    if meta.len() > MAX_FILE {
        return Err(err(format!(
            "{} bytes; a configuration file may have at most {MAX_FILE}",
            meta.len()
        )));
    }
    let raw = std::fs::read(file).map_err(|e| err(format!("cannot read it: {e}")))?;
    String::from_utf8(raw).map_err(|_| err("not UTF-8 text".into()))
}

/// 1-based line of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The server's settings in `text` as flags, key by key, each checked by
/// the server's own parser; keys the command line also gives are left out.
fn flags(
    file: &Path,
    text: &str,
    cli: &Command,
    server: &Command,
    given: &ArgMatches,
) -> Result<Vec<(String, Vec<String>)>, ConfigError> {
    let at = |span: Range<usize>, key: Option<&str>, message: String| ConfigError {
        file: file.to_path_buf(),
        line: Some(line_of(text, span.start)),
        key: key.map(str::to_string),
        message,
    };
    let table = DeTable::parse(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        at(span, None, e.message().trim().to_string())
    })?;
    let mut out = Vec::new();
    for (key, value) in table.get_ref() {
        let name = key.get_ref().as_ref();
        let span = key.span();
        let arg = settings(server).find(|a| a.get_long() == Some(name));
        let Some(arg) = arg else {
            let hint = match settings(server)
                .find(|a| a.get_long() == Some(&name.replace('_', "-")))
            {
                Some(a) => format!("did you mean `{}`?", a.get_long().unwrap_or_default()),
                None => "keys are the long flags `fatpipe server --help` lists, without the dashes"
                    .into(),
            };
            return Err(at(span, Some(name), format!("unknown key; {hint}")));
        };
        let e = |message: String| at(value.span(), Some(name), message);
        let values = values(arg, value.get_ref()).map_err(e)?;
        if given.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        let these: Vec<String> = values.iter().map(|v| format!("--{name}={v}")).collect();
        let these = if takes_value(arg) {
            these
        } else {
            // A switch: `true` is the flag, `false` leaves it off.
            values
                .iter()
                .filter(|v| *v == "true")
                .map(|_| format!("--{name}"))
                .collect()
        };
        // The key alone, through the server's parser: its value parser,
        // ranges and conflicts speak, and the error keeps the key's line.
        let mut alone = vec!["fatpipe".to_string(), "server".to_string()];
        alone.extend(these.iter().cloned());
        if let Err(err) = cli.clone().try_get_matches_from(&alone) {
            if err.kind() != clap::error::ErrorKind::MissingRequiredArgument {
                return Err(e(clap_line(&err)));
            }
        }
        out.push((name.to_string(), these));
    }
    Ok(out)
}

/// The server's flags that are settings.
fn settings(server: &Command) -> impl Iterator<Item = &Arg> {
    server
        .get_arguments()
        .filter(|a| a.get_long().is_some_and(|l| !NOT_KEYS.contains(&l)))
}

fn takes_value(arg: &Arg) -> bool {
    !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    )
}

fn repeatable(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

/// A key's TOML value as the flag's text values.
fn values(arg: &Arg, value: &DeValue<'_>) -> Result<Vec<String>, String> {
    if let Some(items) = value.as_array() {
        if !repeatable(arg) {
            return Err("takes one value, not a list".into());
        }
        return items.iter().map(|v| scalar(arg, v.get_ref())).collect();
    }
    scalar(arg, value).map(|v| vec![v])
}

fn scalar(arg: &Arg, value: &DeValue<'_>) -> Result<String, String> {
    if !takes_value(arg) {
        return value
            .as_bool()
            .map(|b| b.to_string())
            .ok_or_else(|| format!("a switch: true or false, not {}", value.type_str()));
    }
    if let Some(s) = value.as_str() {
        return Ok(s.to_string());
    }
    if let Some(i) = value.as_integer() {
        let digits = i.as_str().replace('_', "");
        return match i.radix() {
            10 => Ok(digits),
            r => i64::from_str_radix(&digits, r)
                .map(|n| n.to_string())
                .map_err(|e| format!("{e}")),
        };
    }
    if let Some(f) = value.as_float() {
        return Ok(f.as_str().replace('_', ""));
    }
    if let Some(b) = value.as_bool() {
        return Ok(b.to_string());
    }
    Err(format!(
        "a string or number, not {} (a table or a date)",
        value.type_str()
    ))
}

/// clap's error as one line, without its `error: ` and usage lines.
fn clap_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The effective settings as a file `--config` reads back: each key with
/// its value and where the value came from.
fn print_config(
    server: &Command,
    m: &ArgMatches,
    given: &ArgMatches,
    file_keys: &[String],
) -> String {
    let mut out = String::from(
        "# fatpipe server: effective settings (`fatpipe server --print-config`).\n\
         # Keys are the long flags of `fatpipe server --help`; a flag on the\n\
         # command line wins over the file's key.\n",
    );
    for arg in settings(server) {
        let Some(name) = arg.get_long() else { continue };
        let id = arg.get_id().as_str();
        let source = if given.value_source(id) == Some(ValueSource::CommandLine) {
            "command line"
        } else if file_keys.iter().any(|k| k == name) {
            "file"
        } else {
            match m.value_source(id) {
                Some(ValueSource::EnvVariable) => "environment",
                Some(ValueSource::DefaultValue) => "default",
                _ => "",
            }
        };
        let raw: Vec<String> = m
            .get_raw(id)
            .map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let line = if !takes_value(arg) {
            // A switch's raw value is "true" or "false" (a count's, a number).
            let on = raw.first().map_or("false", String::as_str);
            format!("{name} = {on}")
        } else if raw.is_empty() {
            format!("# {name} =  (not set)")
        } else if repeatable(arg) {
            let items: Vec<String> = raw.iter().map(|v| toml_value(v)).collect();
            format!("{name} = [{}]", items.join(", "))
        } else {
            format!("{name} = {}", toml_value(&raw[0]))
        };
        // The flag's help above its key, so the file explains itself.
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        out.push('\n');
        for l in wrap(&help, 74) {
            out.push_str(&format!("# {l}\n"));
        }
        // A default is shown commented out: read back, it stays a default
        // (and a flag that needs another, such as the HTTP port's, is not
        // set by the file alone).
        match source {
            "" => out.push_str(&format!("{line}\n")),
            "default" if !line.starts_with('#') => out.push_str(&format!("# {line}  (default)\n")),
            _ => out.push_str(&format!("{line}  # {source}\n")),
        }
    }
    out
}

/// `text`'s words in lines of at most `width` characters (a longer word
/// gets a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// A flag's text as a TOML value: integers bare, the rest quoted.
fn toml_value(v: &str) -> String {
    if v.parse::<i64>().is_ok() {
        return v.to_string();
    }
    toml::Value::String(v.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        Server(ServerArgs),
        Other,
    }

    #[derive(Debug, clap::Args)]
    struct ServerArgs {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        print_config: bool,
        /// Most sessions at once.
        #[arg(long, default_value_t = 64)]
        max_sessions: usize,
        #[arg(long)]
        quiet: bool,
        #[arg(long = "export")]
        exports: Vec<String>,
        #[arg(long)]
        key_file: Option<PathBuf>,
        #[arg(long, default_value = "0.0.0.0")]
        bind: std::net::IpAddr,
    }

    fn expand_with(text: &str, extra: &[&str]) -> Result<Expanded, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("server.toml");
        std::fs::write(&file, text).expect("write config");
        let mut argv: Vec<OsString> = vec!["fatpipe".into(), "server".into()];
        argv.push("--config".into());
        argv.push(file.into());
        argv.extend(extra.iter().map(OsString::from));
        expand(argv, &Cli::command())
    }

    fn run_args(text: &str, extra: &[&str]) -> Vec<String> {
        match expand_with(text, extra) {
            Ok(Expanded::Run(a)) => {
                let a: Vec<String> = a[2..]
                    .iter()
                    .map(|s| s.to_string_lossy().into_owned())
                    .collect();
                // Without the `--config FILE` the command line began with.
                let at = a.iter().position(|s| s == "--config").expect("--config");
                [&a[..at], &a[at + 2..]].concat()
            }
            Ok(Expanded::Print(p)) => panic!("printed {p}"),
            Err(e) => panic!("{e}"),
        }
    }

    fn error(text: &str) -> String {
        match expand_with(text, &[]) {
            Err(e) => {
                let s = e.to_string();
                s[s.find(':').expect("a file name")..].to_string()
            }
            Ok(_) => panic!("{text:?} was taken"),
        }
    }

    #[test]
    fn keys_become_flags_and_the_command_line_wins() {
        let text =
            "max-sessions = 8\nquiet = true\nexport = [\"a=/x\", \"b=/y:ro\"]\nbind = \"::1\"\n";
        let args = run_args(text, &[]);
        // The file's keys in their sorted order, before the command line's.
        assert_eq!(
            args,
            [
                "--bind=::1",
                "--export=a=/x",
                "--export=b=/y:ro",
                "--max-sessions=8",
                "--quiet",
            ]
        );
        let args = run_args(text, &["--max-sessions", "3", "--export", "c=/z"]);
        assert_eq!(
            args,
            [
                "--bind=::1",
                "--quiet",
                "--max-sessions",
                "3",
                "--export",
                "c=/z"
            ]
        );
        assert_eq!(run_args("quiet = false\n", &[]), Vec::<String>::new());
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        assert_eq!(
            error("quiet = true\nmax-sessions = \"many\"\n"),
            ":2: max-sessions: invalid value 'many' for '--max-sessions <MAX_SESSIONS>': invalid digit found in string"
        );
        assert_eq!(
            error("\nmax_sessions = 3\n"),
            ":2: max_sessions: unknown key; did you mean `max-sessions`?"
        );
        assert!(error("colour = 3\n").starts_with(":1: colour: unknown key; keys are"));
        assert_eq!(
            error("bind = [\"::1\"]\n"),
            ":1: bind: takes one value, not a list"
        );
        assert_eq!(
            error("quiet = \"yes\"\n"),
            ":1: quiet: a switch: true or false, not string"
        );
        assert!(error("bind = \"::1\nquiet = true\n").starts_with(":1: "));
        assert!(error("[x]\na = 1\n").starts_with(":1: x: "));
        assert_eq!(
            error("bind = \"not an address\"\n"),
            ":1: bind: invalid value 'not an address' for '--bind <BIND>': invalid IP address syntax"
        );
    }

    #[test]
    fn print_config_reads_back() {
        let text = "max-sessions = 0x10\nexport = [\"a=/x\"]\nkey-file = \"/etc/k\"\n";
        let Ok(Expanded::Print(p)) = expand_with(text, &["--print-config", "--quiet"]) else {
            panic!("no print");
        };
        assert!(
            p.contains("\n# Most sessions at once\nmax-sessions = 16  # file\n"),
            "{p}"
        );
        assert!(p.contains("quiet = true  # command line\n"), "{p}");
        assert!(p.contains("\n# bind = \"0.0.0.0\"  (default)\n"), "{p}");
        assert!(p.contains("quiet = true"), "{p}");
        assert!(p.contains("export = [\"a=/x\"]"), "{p}");
        assert!(p.contains("key-file = \"/etc/k\""), "{p}");
        assert!(
            !p.contains("print-config =") && !p.contains("config ="),
            "{p}"
        );
        // What it printed, read back, is the same configuration.
        assert_eq!(
            run_args(&p, &[]),
            [
                "--export=a=/x",
                "--key-file=/etc/k",
                "--max-sessions=16",
                "--quiet",
            ]
        );
    }

    /// Every flag of the real `fatpipe server` is a key the file takes:
    /// written with its default (or, for a flag without one, a sample
    /// value from this table), it comes back as that flag and the server's
    /// parser takes it. A new flag without a long name, or without a
    /// default and a sample here, fails this test.
    #[test]
    fn every_server_flag_has_a_key() {
        const SAMPLES: &[(&str, &str)] = &[
            ("key-file", "\"/etc/fatpipe/key\""),
            ("export", "[\"data=/srv/fatpipe:ro\"]"),
            ("user", "\"fatpipe\""),
            ("metrics", "\"127.0.0.1:9301\""),
            ("iperf3-port", "5201"),
            ("iperf3-rsa-private-key", "\"/etc/fatpipe/iperf3.pem\""),
            ("iperf3-authorized-users", "\"/etc/fatpipe/iperf3-users\""),
            ("http", "\"[::]:8443\""),
            ("tls-cert", "\"/etc/fatpipe/cert.pem\""),
            ("tls-key", "\"/etc/fatpipe/key.pem\""),
            ("http-audience", "\"https://dtn1.example.org:8443\""),
            (
                "http-issuer",
                "[\"https://iam.example.org/=/etc/fatpipe/iam.jwks\"]",
            ),
            ("http-token-file", "\"/etc/fatpipe/http-tokens\""),
            ("archive", "\"/var/lib/fatpipe/archive.sqlite\""),
            ("http-tpc-allow", "\"private,198.18.0.0/15\""),
            ("http-tpc-ca", "\"/etc/fatpipe/ca.pem\""),
        ];
        let cli = crate::Cli::command();
        let server = cli.find_subcommand("server").expect("a server subcommand");
        let mut checked = 0;
        for arg in server.get_arguments() {
            let id = arg.get_id().as_str();
            if ["help", "version", "config", "print_config"].contains(&id) {
                continue;
            }
            let name = arg
                .get_long()
                .unwrap_or_else(|| panic!("server flag {id} has no long name, so no key"));
            let value = if !takes_value(arg) {
                "true".to_string()
            } else if let Some((_, v)) = SAMPLES.iter().find(|(k, _)| *k == name) {
                v.to_string()
            } else {
                let d = arg.get_default_values();
                assert!(
                    !d.is_empty(),
                    "server flag --{name} has no default: add a sample value to SAMPLES"
                );
                toml_value(&d[0].to_string_lossy())
            };
            let text = format!("{name} = {value}\n");
            let dir = tempfile::tempdir().expect("tempdir");
            let file = dir.path().join("server.toml");
            std::fs::write(&file, &text).expect("write config");
            let argv: Vec<OsString> = ["fatpipe", "server", "--config"]
                .iter()
                .map(OsString::from)
                .chain([file.into_os_string()])
                .collect();
            match expand(argv, &cli) {
                Ok(Expanded::Run(a)) => {
                    let want = format!("--{name}");
                    assert!(
                        a.iter().any(|s| s.to_string_lossy().starts_with(&want)),
                        "{text} gave {a:?}"
                    );
                }
                Ok(Expanded::Print(_)) => panic!("printed"),
                Err(e) => panic!("{text}: {e}"),
            }
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} server flags");
    }

    #[test]
    fn only_server_command_lines_with_a_file_or_print_are_expanded() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(wanted(&v(&["fatpipe", "server", "--config", "f"])));
        assert!(wanted(&v(&["fatpipe", "server", "-q", "--config=f"])));
        assert!(wanted(&v(&["fatpipe", "server", "--print-config"])));
        assert!(!wanted(&v(&["fatpipe", "server", "--port", "0"])));
        assert!(!wanted(&v(&["fatpipe", "test", "--config", "f"])));
        assert!(!wanted(&v(&["fatpipe"])));
    }

    #[test]
    fn other_commands_pass_through() {
        let argv: Vec<OsString> = ["fatpipe", "other"].iter().map(OsString::from).collect();
        let Ok(Expanded::Run(a)) = expand(argv.clone(), &Cli::command()) else {
            panic!("not passed through");
        };
        assert_eq!(a, argv);
    }
}
