//! `fatpipe key new PATH`: a fresh pre-shared key, private from its first
//! byte.
//!
//! The file is created with mode 0600 (never written first and narrowed
//! after, so no other user can open it in between): 32 bytes from the
//! kernel's random source, as 64 hex digits and a newline. The server and
//! the clients refuse a key file other users may read (`load_key`), so a
//! key copied without care is caught at its first use, not after a leak.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Arguments of `fatpipe key`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

/// What `fatpipe key` does.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Write a fresh pre-shared key to PATH (mode 0600) for --key-file.
    New {
        /// The key file to create; it must not exist unless --force.
        path: PathBuf,
        /// Replace PATH if it exists (atomically: the old key stays until
        /// the new one is complete).
        #[arg(long)]
        force: bool,
    },
}

/// Runs `fatpipe key`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::New { path, force } => {
            new_key(&path, force)?;
            eprintln!(
                "fatpipe: wrote a new key to {} (mode 0600); give it to the server and its clients with --key-file",
                fatpipe_proto::escape(&path.display().to_string())
            );
            Ok(())
        }
    }
}

fn new_key(path: &Path, force: bool) -> anyhow::Result<()> {
    let shown = fatpipe_proto::escape(&path.display().to_string()).into_owned();
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("no random bytes from the kernel: {e}"))?;
    let mut text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    if path.exists() && !force {
        return Err(crate::exit::usage(format!(
            "{shown} exists; keep it, or replace it with --force"
        )));
    }
    // Written beside the final name and renamed over it, so a crash leaves
    // either the old key or the new one, never half of one.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| crate::exit::usage(format!("{shown}: give a file name")))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".new-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        if force {
            std::fs::rename(&tmp, path)
        } else {
            // No replacing a key that appeared meanwhile.
            std::fs::hard_link(&tmp, path).and_then(|()| std::fs::remove_file(&tmp))
        }
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(crate::exit::usage(format!("write {shown}: {e}")));
    }
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_key_is_private_fresh_and_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k");
        new_key(&path, false).expect("new key");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = std::fs::read_to_string(&path).expect("read");
        assert_eq!(first.len(), 65);
        assert!(first.trim_end().chars().all(|c| c.is_ascii_hexdigit()));
        fatpipe_engine::load_key(&path).expect("the server takes it");
        let err = new_key(&path, false).expect_err("no overwrite");
        assert!(err.to_string().contains("exists"), "{err}");
        new_key(&path, true).expect("--force");
        assert_ne!(std::fs::read_to_string(&path).expect("read"), first);
        // Nothing left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
    }

    #[test]
    fn a_key_others_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k");
        new_key(&path, false).expect("new key");
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let err = fatpipe_engine::load_key(&path).expect_err("refused");
            let text = err.to_string();
            assert!(text.contains(&format!("(mode {mode:04o})")), "{text}");
            assert!(
                text.contains(&format!("chmod 600 {}", path.display())),
                "{text}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        fatpipe_engine::load_key(&path).expect("0400 is private");
    }
}
