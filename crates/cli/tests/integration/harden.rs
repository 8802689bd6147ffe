//! A server you can expose (issue 16), the real binary on loopback: text
//! from the peer reaches the user's terminal escaped (the scp
//! CVE-2019-6109 class: a server's export holding names with ESC and CR);
//! a keyed server serves its `:public` exports, and only those, to clients
//! without the key; `server --user` drops root and checks its exports.
//! The flood tests are in `flood`.

use std::process::Command;

use crate::util::{assert_exit, mkdir, run, setup, spawn_server};

/// The hostile name: clear the screen, return to the line's start.
const EVIL: &str = "evil\x1b[2J\rname";
/// How the client must show it.
const SHOWN: &str = "evil\\x1b[2J\\x0dname";

#[test]
fn hostile_names_from_the_server_are_escaped_in_notes_and_errors() {
    let dir = setup();
    let export = mkdir(&dir.path().join("export"));
    let tree = mkdir(&export.join("tree"));
    std::fs::write(tree.join("ok"), b"fine").unwrap();
    // A FIFO is skipped with a note naming it (sent by the server).
    let fifo = tree.join(EVIL);
    assert_exit(&run(Command::new("mkfifo").arg(&fifo)), 0);
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .arg("--export")
        .arg(format!("x={}:public", export.display()));
    let (_srv, port) = spawn_server(cmd);
    let dest = dir.path().join("dest");

    let out = run(dir
        .cmd()
        .args(["copy", "-r", "--port", &port.to_string()])
        .arg("127.0.0.1:x/tree")
        .arg(&dest));
    assert_exit(&out, 0);
    let all = [out.stdout, out.stderr].concat();
    let text = String::from_utf8_lossy(&all);
    assert!(text.contains(SHOWN), "no escaped name in:\n{text}");
    assert!(
        !all.contains(&0x1b),
        "a raw ESC reached the terminal:\n{text}"
    );

    // A refusal quoting a name: the error line on stderr is escaped too.
    let out = run(dir
        .cmd()
        .args(["copy", "--port", &port.to_string()])
        .arg(format!("127.0.0.1:x/{EVIL}-missing"))
        .arg(dir.path().join("d2")));
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{SHOWN}-missing")), "{err}");
    assert!(
        !out.stderr.contains(&0x1b) && !out.stderr.contains(&b'\r'),
        "{err}"
    );
}

/// A keyed server serves its `:public` exports to clients without the
/// key, and nothing else: not its other exports, not `test` (issue 16).
#[test]
fn a_keyed_server_serves_public_exports_and_only_them_without_the_key() {
    let dir = setup();
    let key = dir.path().join("key");
    crate::util::write_key(&key, "public-test-key-0123\n");
    let public = mkdir(&dir.path().join("pub"));
    let private = mkdir(&dir.path().join("priv"));
    std::fs::write(public.join("open"), b"anyone may read this").unwrap();
    std::fs::write(private.join("secret"), b"key holders only").unwrap();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .arg("--key-file")
        .arg(&key)
        .arg("--export")
        .arg(format!("pub={}:public", public.display()))
        .arg("--export")
        .arg(format!("priv={}", private.display()));
    let (_srv, port) = spawn_server(cmd);
    let copy = |src: &str, dst: &str| {
        run(dir.cmd().args([
            "copy",
            "--retries",
            "0",
            "--port",
            &port.to_string(),
            src,
            dst,
        ]))
    };

    let out = copy("127.0.0.1:pub/open", "got-open");
    assert_exit(&out, 0);
    assert_eq!(
        std::fs::read(dir.path().join("got-open")).unwrap(),
        b"anyone may read this"
    );
    let out = copy("127.0.0.1:priv/secret", "got-secret");
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not public"), "{err}");
    assert!(!dir.path().join("got-secret").exists());
    let out = run(dir
        .cmd()
        .args(["test", &format!("127.0.0.1:{port}"), "-t", "0.2"]));
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requires a key"), "{err}");
}

/// `server --user nobody` binds as root, then runs as nobody; exports it
/// could be tricked through (owned by another user, writable by others)
/// stop it from starting, with one line (issue 16).
#[test]
fn server_user_drops_root_and_checks_its_exports() {
    use std::os::unix::fs::{chown, PermissionsExt};
    if !crate::util::need_root("server_user_drops_root_and_checks_its_exports") {
        return;
    }
    let dir = setup();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    // The temporary directory is root's 0700: nobody must pass through.
    mode(dir.path(), 0o755);
    let export = mkdir(&dir.path().join("export"));
    mode(&export, 0o755);
    std::fs::write(export.join("f"), b"readable by nobody").unwrap();
    mode(&export.join("f"), 0o644);
    let server = |extra: &[&str]| {
        let mut cmd = dir.cmd();
        cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
            .args(["--user", "nobody", "--export"])
            .arg(format!("x={}:public", export.display()))
            .args(extra);
        cmd
    };

    let (srv, port) = spawn_server(server(&[]));
    let status = std::fs::read_to_string(format!("/proc/{}/status", srv.0.id())).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let gids = status.lines().find(|l| l.starts_with("Gid:")).unwrap();
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(
        uids.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["65534"; 4],
        "{uids}"
    );
    assert!(!gids.split_whitespace().skip(1).any(|g| g == "0"), "{gids}");
    assert!(
        !groups.split_whitespace().skip(1).any(|g| g == "0"),
        "{groups}"
    );
    let out = run(dir
        .cmd()
        .args(["copy", "--retries", "0", "--port", &port.to_string()])
        .args(["127.0.0.1:x/f", "got"]));
    assert_exit(&out, 0);
    drop(srv);

    mode(&export, 0o777);
    let out = run(&mut server(&[]));
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("writable by others"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    mode(&export, 0o755);

    chown(&export, Some(12345), None).unwrap();
    let out = run(&mut server(&[]));
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("owned by uid 12345"), "{err}");
}
