//! `tune --apply` and `--revert`: write the Linux settings with a backup,
//! and put the backup back.
//!
//! The order is what makes this safe on a production DTN: read every value
//! to be changed first (a value that cannot be read aborts before anything
//! is written), save them to a backup file (written whole, synced, then
//! renamed into place), then write; if a write fails, the values already
//! written are rolled back. Only settings whose value differs are touched,
//! and applying twice writes no second backup, so one `--revert` always
//! returns to the state before the first `--apply`. A reverted backup is
//! renamed `*.reverted`, so a second `--revert` reaches the one before it.
//!
//! Paths hang off a [`Host`], so the tests run on a fake `/proc/sys`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::host::{normalise, Host, Probe, SYSCTLS};
use crate::rules::Setting;
use crate::Error;

/// Where backups go unless `--backup-dir` says otherwise.
pub const DEFAULT_BACKUP_DIR: &str = "/var/lib/fatpipe";

/// One sysctl that was changed: key, old value, new value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Dotted sysctl name.
    pub key: String,
    /// Value before.
    pub old: String,
    /// Value after.
    pub new: String,
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The backup written; `None` when nothing needed changing.
    pub backup: Option<PathBuf>,
    /// The settings written, in order.
    pub changes: Vec<Change>,
    /// Settings left out on this host, with why.
    pub skipped: Vec<(String, String)>,
}

/// What `revert` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reverted {
    /// The backup restored (now renamed `*.reverted`).
    pub backup: PathBuf,
    /// Settings written back: key, value restored.
    pub restored: Vec<(String, String)>,
}

/// Applies `settings` to `host`, saving the old values in `backup_dir` under
/// `tune-backup-<stamp>.conf` first. `stamp` must sort by time (the binary
/// passes Unix seconds and nanoseconds).
pub fn apply(
    host: &Host,
    settings: &[Setting],
    backup_dir: &Path,
    stamp: &str,
) -> Result<Applied, Error> {
    let mut changes = Vec::new();
    let mut skipped = Vec::new();
    for s in settings {
        if let Some(why) = &s.skip {
            skipped.push((s.key.to_string(), why.clone()));
            continue;
        }
        let old = match host.sysctl(s.key) {
            Probe::Known(v) => v,
            Probe::Unknown(why) => {
                return Err(Error::Unreadable {
                    key: s.key.to_string(),
                    why,
                })
            }
        };
        if old != normalise(&s.value) {
            changes.push(Change {
                key: s.key.to_string(),
                old,
                new: normalise(&s.value),
            });
        }
    }
    if changes.is_empty() {
        return Ok(Applied {
            backup: None,
            changes,
            skipped,
        });
    }
    let backup = backup_dir.join(format!("tune-backup-{stamp}.conf"));
    write_backup(&backup, &changes)?;
    for (i, c) in changes.iter().enumerate() {
        if let Err(source) = write_sysctl(host, &c.key, &c.new) {
            let mut restore_failed = Vec::new();
            for done in changes[..i].iter().rev() {
                if let Err(e) = write_sysctl(host, &done.key, &done.old) {
                    restore_failed.push(format!("{}: {e}", done.key));
                }
            }
            return Err(Error::Write {
                key: c.key.clone(),
                value: c.new.clone(),
                source,
                rollback: if restore_failed.is_empty() {
                    "the values already written were rolled back".to_string()
                } else {
                    format!(
                        "rolling back failed too ({}); restore from {}",
                        restore_failed.join("; "),
                        backup.display()
                    )
                },
            });
        }
    }
    Ok(Applied {
        backup: Some(backup),
        changes,
        skipped,
    })
}

/// Restores the newest backup in `backup_dir` and marks it reverted.
pub fn revert(host: &Host, backup_dir: &Path) -> Result<Reverted, Error> {
    let backup = latest_backup(backup_dir)?;
    let text = fs::read_to_string(&backup).map_err(|source| Error::Backup {
        path: backup.clone(),
        source,
    })?;
    let restored = parse_backup(&backup, &text)?;
    let mut failed = Vec::new();
    for (key, value) in &restored {
        if let Err(e) = write_sysctl(host, key, value) {
            failed.push(format!("{key}: {e}"));
        }
    }
    if !failed.is_empty() {
        return Err(Error::Revert {
            path: backup,
            failed: failed.join("; "),
        });
    }
    let done = backup.with_extension("conf.reverted");
    fs::rename(&backup, &done).map_err(|source| Error::Backup {
        path: backup.clone(),
        source,
    })?;
    Ok(Reverted {
        backup: done,
        restored,
    })
}

/// The newest `tune-backup-*.conf` in a directory.
pub fn latest_backup(dir: &Path) -> Result<PathBuf, Error> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NoBackup(dir.to_path_buf()))
        }
        Err(source) => {
            return Err(Error::Backup {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tune-backup-") && n.ends_with(".conf"))
        .max()
        .map(|n| dir.join(n))
        .ok_or_else(|| Error::NoBackup(dir.to_path_buf()))
}

fn parse_backup(path: &Path, text: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: String| Error::BadBackup {
            path: path.to_path_buf(),
            line: i + 1,
            why,
        };
        let Some((key, value)) = line.split_once('=') else {
            return Err(bad("expected 'key = value'".to_string()));
        };
        let key = key.trim();
        // Only settings fatpipe itself writes: a tampered or foreign file
        // must not become a way to set arbitrary sysctls as root.
        if !SYSCTLS.contains(&key) {
            return Err(bad(format!("'{key}' is not a setting fatpipe tune writes")));
        }
        out.push((key.to_string(), normalise(value)));
    }
    Ok(out)
}

fn write_backup(path: &Path, changes: &[Change]) -> Result<(), Error> {
    let err = |source| Error::Backup {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(err)?;
    }
    let mut text =
        String::from("# fatpipe tune: values before --apply; restore with fatpipe tune --revert\n");
    for c in changes {
        text.push_str(&format!("{} = {}\n", c.key, c.old));
    }
    let tmp = path.with_extension("conf.tmp");
    let mut f = fs::File::create(&tmp).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    fs::rename(&tmp, path).map_err(err)
}

fn write_sysctl(host: &Host, key: &str, value: &str) -> std::io::Result<()> {
    // No create: a sysctl the kernel lacks must fail, not become a new file.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(host.sysctl_path(key))?;
    f.write_all(format!("{value}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::host::tests::{fake_tree, TYPICAL};
    use crate::rules::{linux_settings, Target};

    fn settings(host: &Host) -> Vec<Setting> {
        let t = Target {
            rate: 10_000_000_000,
            rtt: Duration::from_millis(100),
        };
        linux_settings(&t, &host.collect(None))
    }

    fn snapshot(host: &Host) -> Vec<Probe<String>> {
        SYSCTLS.iter().map(|k| host.sysctl(k)).collect()
    }

    #[test]
    fn apply_then_revert_restores_everything() {
        let dir = fake_tree(TYPICAL);
        let host = Host::at(dir.path());
        let backups = dir.path().join("backups");
        let before = snapshot(&host);
        let set = settings(&host);

        let a = apply(&host, &set, &backups, "0000000001.000000000").expect("apply");
        assert!(a.backup.is_some());
        assert!(a.skipped.iter().any(|(k, _)| k == "net.core.default_qdisc"));
        assert_eq!(
            host.sysctl("net.core.rmem_max"),
            Probe::Known("268435456".to_string())
        );
        assert_eq!(
            host.sysctl("net.ipv4.tcp_rmem"),
            Probe::Known("4096 131072 268435456".to_string())
        );
        // Unchanged values are not touched (nor backed up).
        assert!(!a.changes.iter().any(|c| c.key == "net.ipv4.tcp_sack"));

        // A second apply changes nothing and writes no backup.
        let again = apply(&host, &set, &backups, "0000000002.000000000").expect("apply again");
        assert_eq!(again.backup, None);
        assert!(again.changes.is_empty());

        let r = revert(&host, &backups).expect("revert");
        assert!(r.backup.to_string_lossy().ends_with(".conf.reverted"));
        assert_eq!(snapshot(&host), before);
        assert!(matches!(revert(&host, &backups), Err(Error::NoBackup(_))));
    }

    #[test]
    fn a_failed_write_rolls_back() {
        let dir = fake_tree(TYPICAL);
        let host = Host::at(dir.path());
        let before = snapshot(&host);
        let mut set = settings(&host);
        // A key the fake kernel lacks: reading it fails before any write.
        set.push(Setting {
            key: "net.ipv4.tcp_ecn",
            value: "1".to_string(),
            why: "test",
            skip: None,
        });
        let err = apply(&host, &set, &dir.path().join("b"), "1").expect_err("unreadable");
        assert!(matches!(err, Error::Unreadable { .. }), "{err}");
        assert_eq!(snapshot(&host), before);
        assert!(
            !dir.path().join("b").exists(),
            "no backup before a failed read"
        );

        // A sysctl that reads but refuses writes (/proc/version does, even
        // for root) fails after others succeeded: those are rolled back.
        let set = settings(&host);
        let last = set
            .iter()
            .rev()
            .find(|s| s.skip.is_none())
            .expect("a setting")
            .key;
        let path = host.sysctl_path(last);
        fs::remove_file(&path).expect("remove");
        std::os::unix::fs::symlink("/proc/version", &path).expect("symlink");
        let err = apply(&host, &set, &dir.path().join("b"), "2").expect_err("write fails");
        assert!(
            matches!(&err, Error::Write { key, .. } if key == last),
            "{err}"
        );
        assert!(err.to_string().contains("rolled back"), "{err}");
        for (k, b) in SYSCTLS.iter().zip(&before) {
            if *k != last {
                assert_eq!(&host.sysctl(k), b, "{k}");
            }
        }
    }

    #[test]
    fn backups_only_name_known_settings() {
        let dir = fake_tree(&[
            ("b/tune-backup-1.conf", "# ok\nnet.core.rmem_max = 1\n"),
            ("b/tune-backup-2.conf", "kernel.core_pattern = |/bin/sh\n"),
        ]);
        let host = Host::at(dir.path());
        let err = revert(&host, &dir.path().join("b")).expect_err("foreign key");
        assert!(err.to_string().contains("kernel.core_pattern"), "{err}");
        assert!(matches!(
            revert(&host, &dir.path().join("none")),
            Err(Error::NoBackup(_))
        ));
    }
}
