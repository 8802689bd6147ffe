//! `fatpipe server --config FILE` and `fatpipe key new` (issue 32): a
//! server configured from its file serves, the command line wins, an error
//! is one line with the file, line and key before anything listens, and a
//! key other users can read is refused by both ends.

use std::os::unix::fs::PermissionsExt;

use crate::util::{assert_exit, run, setup, spawn_server, stderr, write_key};

#[test]
fn a_server_from_its_file_serves_a_keyed_copy_and_the_command_line_wins() {
    let dir = setup();
    let key = dir.path().join("key");
    assert_exit(&run(dir.cmd().args(["key", "new"]).arg(&key)), 0);
    let export = dir.path().join("export");
    std::fs::create_dir(&export).expect("mkdir export");
    let conf = dir.path().join("server.toml");
    std::fs::write(
        &conf,
        format!(
            "# a server from its file\nbind = \"127.0.0.1\"\nport = 1\nkey-file = {:?}\n\
             export = [\"d={}\"]\nquiet = true\nmax-sessions = 4\n",
            key.display(),
            export.display()
        ),
    )
    .expect("write config");
    // The file's port 1 is overridden by the command line's 0.
    let mut cmd = dir.cmd();
    cmd.args(["server", "--config"])
        .arg(&conf)
        .args(["--port", "0"]);
    let (_srv, port) = spawn_server(cmd);
    std::fs::write(dir.path().join("f.bin"), vec![7u8; 100_000]).expect("source");
    let out = run(dir
        .cmd()
        .args(["copy", "--no-auto", "-q", "f.bin", "127.0.0.1:d/f.bin"])
        .args(["-p", &port.to_string(), "--key-file"])
        .arg(&key));
    assert_exit(&out, 0);
    assert_eq!(
        std::fs::read(export.join("f.bin")).expect("copied"),
        vec![7u8; 100_000]
    );
    // Without the key the export (not :public) is not served: the file's
    // key-file took effect.
    let out = run(dir
        .cmd()
        .args(["copy", "--no-auto", "-q", "f.bin", "127.0.0.1:d/g.bin"])
        .args(["-p", &port.to_string()]));
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = run(dir.cmd().args(["server", "--config"]).arg(&conf).args([
        "--max-sessions",
        "9",
        "--print-config",
    ]));
    assert_exit(&out, 0);
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in [
        "port = 1  # file",
        "max-sessions = 9  # command line",
        "quiet = true  # file",
        "max-streams = ",
    ] {
        assert!(printed.contains(line), "{line:?} not in\n{printed}");
    }
    // What it printed is a configuration the server reads back.
    let again = dir.path().join("again.toml");
    std::fs::write(&again, &printed).expect("write printed");
    let out = run(dir
        .cmd()
        .args(["server", "--config"])
        .arg(&again)
        .arg("--print-config"));
    assert_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("max-sessions = 9  # file"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_bad_file_is_one_line_with_its_line_and_key_and_nothing_listens() {
    let dir = setup();
    let conf = dir.path().join("server.toml");
    for (text, want) in [
        (
            "port = 0\nmax-sessions = \"lots\"\n",
            ":2: max-sessions: invalid value 'lots'",
        ),
        (
            "port = 0\n\nmax_streams = 3\n",
            ":3: max_streams: unknown key; did you mean `max-streams`?",
        ),
        ("port = 0\nexport = \"unterminated\n", ":2: "),
        ("port = [1, 2]\n", ":1: port: takes one value, not a list"),
    ] {
        std::fs::write(&conf, text).expect("write config");
        let out = run(dir.cmd().args(["server", "--config"]).arg(&conf));
        assert_exit(&out, 2);
        assert!(out.stdout.is_empty(), "it listened: {:?}", out.stdout);
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("{}{want}", conf.display())),
            "{want:?} not in {err}"
        );
    }
    let out = run(dir
        .cmd()
        .args(["server", "--config"])
        .arg(dir.path().join("missing.toml")));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("missing.toml: cannot read it"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_key_others_can_read_is_refused_by_server_and_client() {
    let dir = setup();
    let key = dir.path().join("key");
    write_key(&key, "a-key-for-the-mode-test-0123\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let fix = format!("chmod 600 {}", key.display());
    let out = run(dir
        .cmd()
        .args(["server", "--port", "0", "--key-file"])
        .arg(&key));
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains("(mode 0644)") && err.contains(&fix), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = run(dir
        .cmd()
        .args(["test", "127.0.0.1", "-p", "9", "--key-file"])
        .arg(&key));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains(&fix), "{}", stderr(&out));
    // `key new` never replaces a key unless told to.
    let out = run(dir.cmd().args(["key", "new"]).arg(&key));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("exists"), "{}", stderr(&out));
    assert_exit(&run(dir.cmd().args(["key", "new", "--force"]).arg(&key)), 0);
    let mode = std::fs::metadata(&key).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}
