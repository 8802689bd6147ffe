//! iperf3's RSA authentication, both ends (`--username`,
//! `--rsa-public-key-path` on a client; `--rsa-private-key-path`,
//! `--authorized-users-path` on a server), as iperf3's `iperf_auth.c`
//! defines it, because perfSONAR's two-ended tests always use it.
//!
//! The client puts `user: NAME\npwd:  PASSWORD\nts:   UNIX-SECONDS` through
//! RSA encryption with the server's public key and sends it base64-encoded
//! as the `authtoken` parameter. The server decrypts it with its private
//! key, refuses a timestamp further than the skew (10 s by default) from
//! its clock, and looks the user up in its authorized-users file, whose
//! lines are `NAME,HASH` with HASH the hex SHA-256 of `{NAME}PASSWORD`
//! (`#` starts a comment).
//!
//! Padding: iperf3 before 3.17 (Debian 12's 3.12) uses PKCS#1 v1.5;
//! 3.17 and later use OAEP (SHA-1), PKCS#1 v1.5 with `--use-pkcs1-padding`.
//! A server here accepts either; a client uses PKCS#1 v1.5 unless told
//! OAEP ([`Padding`]), since the iperf3 servers deployed today are mostly
//! older than 3.17.
//!
//! Every failure of a token (not base64, too long, not decryptable, not the
//! format, too old, unknown user, wrong password) is one [`AuthError::Refused`]
//! with the same text to the peer, so the server answers nothing a peer can
//! tell the cases apart by; the reason goes to the server's log only. Note:
//! RSA decryption with the `rsa` crate is not constant-time (RUSTSEC-2023-0071,
//! "Marvin"); each attempt costs the attacker a whole iperf3 session, under
//! the server's handshake timeout and session cap.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::{Oaep, Pkcs1v15Encrypt, RsaPrivateKey, RsaPublicKey};
use sha2::{Digest, Sha256};

/// Longest `authtoken` a server decodes (a 16384-bit key's ciphertext in
/// base64 is under 3 KiB).
pub const MAX_TOKEN: usize = 4096;
/// iperf3's default time skew threshold, seconds.
pub const DEFAULT_SKEW_S: u64 = 10;
/// Longest key or authorized-users file read.
const MAX_FILE: u64 = 1 << 20;

/// Why authentication could not be set up or a token was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A key or users file could not be read or parsed (the user's to fix).
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// The token was refused; the reason is for the server's log.
    #[error("authentication failed: {0}")]
    Refused(String),
    /// Encryption failed (a key too small for the message).
    #[error("cannot encrypt the credentials: {0}")]
    Encrypt(String),
}

/// Which RSA padding a client encrypts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// PKCS#1 v1.5, what iperf3 before 3.17 (and `--use-pkcs1-padding`)
    /// expects.
    Pkcs1v15,
    /// OAEP with SHA-1, what iperf3 3.17 and later expect by default.
    Oaep,
}

/// What a client authenticates with.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// The password (iperf3 reads it from `IPERF3_PASSWORD`).
    pub password: String,
    /// The server's public key.
    pub key: RsaPublicKey,
    /// The padding the server expects.
    pub padding: Padding,
}

/// A server's authentication: its private key and the users it admits.
#[derive(Debug, Clone)]
pub struct Authorizer {
    key: RsaPrivateKey,
    /// User name to hex SHA-256 of `{user}password`.
    users: BTreeMap<String, String>,
    skew_s: u64,
}

/// Reads an RSA public key (PEM: `PUBLIC KEY`, as `openssl rsa -pubout`
/// writes it, or `RSA PUBLIC KEY`).
pub fn load_public_key(path: &Path) -> Result<RsaPublicKey, AuthError> {
    let text = read(path)?;
    RsaPublicKey::from_public_key_pem(text.trim())
        .or_else(|_| RsaPublicKey::from_pkcs1_pem(text.trim()))
        .map_err(|e| file_err(path, format!("not an RSA public key in PEM ({e})")))
}

/// Reads an RSA private key (PEM: `RSA PRIVATE KEY` or `PRIVATE KEY`).
pub fn load_private_key(path: &Path) -> Result<RsaPrivateKey, AuthError> {
    let text = read(path)?;
    RsaPrivateKey::from_pkcs1_pem(text.trim())
        .or_else(|_| RsaPrivateKey::from_pkcs8_pem(text.trim()))
        .map_err(|e| {
            file_err(
                path,
                format!("not an unencrypted RSA private key in PEM ({e})"),
            )
        })
}

/// The hex SHA-256 of `{user}password`: an authorized-users entry.
pub fn user_hash(user: &str, password: &str) -> String {
    let digest = Sha256::digest(format!("{{{user}}}{password}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `authtoken` for `creds` at Unix time `now`.
pub fn token(creds: &Credentials, now: i64) -> Result<String, AuthError> {
    let plain = format!(
        "user: {}\npwd:  {}\nts:   {now}",
        creds.user, creds.password
    );
    let mut rng = rand_core::OsRng;
    let sealed = match creds.padding {
        Padding::Pkcs1v15 => creds
            .key
            .encrypt(&mut rng, Pkcs1v15Encrypt, plain.as_bytes()),
        Padding::Oaep => creds
            .key
            .encrypt(&mut rng, Oaep::new::<sha1::Sha1>(), plain.as_bytes()),
    }
    .map_err(|e| AuthError::Encrypt(e.to_string()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(sealed))
}

impl Authorizer {
    /// Loads the private key and the authorized-users file.
    pub fn load(private_key: &Path, users: &Path, skew_s: u64) -> Result<Authorizer, AuthError> {
        let key = load_private_key(private_key)?;
        let users = parse_users(&read(users)?).map_err(|what| file_err(users, what))?;
        Ok(Authorizer { key, users, skew_s })
    }

    /// A server admitting `users` (name, password) with `key`: for tests.
    pub fn with_users(key: RsaPrivateKey, users: &[(&str, &str)], skew_s: u64) -> Authorizer {
        Authorizer {
            key,
            users: users
                .iter()
                .map(|(u, p)| (u.to_string(), user_hash(u, p)))
                .collect(),
            skew_s,
        }
    }

    /// A server with a fresh 1024-bit key admitting `users`: for tests and
    /// the fuzz target (a real server loads its key with [`Authorizer::load`]).
    pub fn ephemeral(users: &[(&str, &str)], skew_s: u64) -> Result<Authorizer, AuthError> {
        let mut rng = rand_core::OsRng;
        let key = RsaPrivateKey::new(&mut rng, 1024)
            .map_err(|e| AuthError::Encrypt(format!("cannot make a key: {e}")))?;
        Ok(Authorizer::with_users(key, users, skew_s))
    }

    /// The public half of this server's key (what its clients hold).
    pub fn public_key(&self) -> RsaPublicKey {
        self.key.to_public_key()
    }

    /// Checks a client's token at Unix time `now`; the user it names.
    pub fn check(&self, token: Option<&str>, now: i64) -> Result<String, AuthError> {
        let refused = |why: &str| AuthError::Refused(why.to_string());
        let token = token.ok_or_else(|| refused("no authtoken: the client gave no --username"))?;
        if token.len() > MAX_TOKEN {
            return Err(refused("authtoken too long"));
        }
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(token.trim().as_bytes())
            .map_err(|_| refused("authtoken is not base64"))?;
        self.check_sealed(&sealed, now)
    }

    /// [`Authorizer::check`] after the base64: the ciphertext itself.
    pub fn check_sealed(&self, sealed: &[u8], now: i64) -> Result<String, AuthError> {
        let refused = |why: &str| AuthError::Refused(why.to_string());
        if sealed.len() > MAX_TOKEN {
            return Err(refused("authtoken too long"));
        }
        let plain = self
            .key
            .decrypt(Oaep::new::<sha1::Sha1>(), sealed)
            .or_else(|_| self.key.decrypt(Pkcs1v15Encrypt, sealed))
            .map_err(|_| refused("authtoken does not decrypt with this server's key"))?;
        let text = String::from_utf8(plain).map_err(|_| refused("credentials are not text"))?;
        let (user, password, ts) = parse_credentials(&text)
            .ok_or_else(|| refused("credentials are not iperf3's format"))?;
        if now.abs_diff(ts) > self.skew_s {
            return Err(AuthError::Refused(format!(
                "timestamp {ts} is {} s from this server's clock (more than {} s)",
                now.abs_diff(ts),
                self.skew_s
            )));
        }
        match self.users.get(&user) {
            Some(hash) if *hash == user_hash(&user, &password) => Ok(user),
            Some(_) => Err(AuthError::Refused(format!(
                "wrong password for user {user:?}"
            ))),
            None => Err(AuthError::Refused(format!("unknown user {user:?}"))),
        }
    }
}

/// Reads `user: U\npwd:  P\nts:   T` (whitespace as `sscanf` takes it:
/// any run of it between the fields; a name or password has none).
fn parse_credentials(text: &str) -> Option<(String, String, i64)> {
    let mut words = text.split_whitespace();
    if words.next()? != "user:" {
        return None;
    }
    let user = words.next()?.to_string();
    if words.next()? != "pwd:" {
        return None;
    }
    let password = words.next()?.to_string();
    if words.next()? != "ts:" {
        return None;
    }
    let ts = words.next()?.parse().ok()?;
    words.next().is_none().then_some((user, password, ts))
}

/// Parses an authorized-users file: `user,sha256hex` per line, `#`
/// comments and blank lines ignored.
fn parse_users(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut users = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (user, hash) = line
            .split_once(',')
            .ok_or_else(|| format!("line {}: expected USER,SHA256HEX", i + 1))?;
        let hash = hash.trim().to_ascii_lowercase();
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("line {}: the hash is not 64 hex digits", i + 1));
        }
        users.insert(user.trim().to_string(), hash);
    }
    if users.is_empty() {
        return Err("no users (lines USER,SHA256HEX of \"{USER}PASSWORD\")".into());
    }
    Ok(users)
}

fn read(path: &Path) -> Result<String, AuthError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| file_err(path, e.to_string()))?;
    let mut text = String::new();
    f.take(MAX_FILE)
        .read_to_string(&mut text)
        .map_err(|e| file_err(path, e.to_string()))?;
    Ok(text)
}

fn file_err(path: &Path, what: String) -> AuthError {
    AuthError::File {
        path: path.display().to_string(),
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RsaPrivateKey {
        // A small key keeps the test fast; the format does not care.
        let mut rng = rand_core::OsRng;
        RsaPrivateKey::new(&mut rng, 1024).expect("generate a test key")
    }

    #[test]
    fn the_hash_is_sha256_of_the_braced_user_and_password() {
        // printf '{mario}rossi' | sha256sum
        assert_eq!(
            user_hash("mario", "rossi"),
            "bf7a49a846d44b454a5d11e7acfaf13d138bbe0b7483aa3e050879700572709b"
        );
    }

    #[test]
    fn tokens_round_trip_in_both_paddings_and_are_refused_when_wrong() {
        let k = key();
        let auth = Authorizer::with_users(k.clone(), &[("mario", "rossi")], 10);
        for padding in [Padding::Pkcs1v15, Padding::Oaep] {
            let creds = Credentials {
                user: "mario".into(),
                password: "rossi".into(),
                key: k.to_public_key(),
                padding,
            };
            let t = token(&creds, 1_000_000).unwrap();
            assert_eq!(auth.check(Some(&t), 1_000_005).unwrap(), "mario");
            let e = auth.check(Some(&t), 1_000_011).unwrap_err().to_string();
            assert!(e.contains("11 s"), "{e}");
            let wrong = Credentials {
                password: "verdi".into(),
                ..creds.clone()
            };
            let e = auth.check(Some(&token(&wrong, 1_000_000).unwrap()), 1_000_000);
            assert!(e.unwrap_err().to_string().contains("wrong password"));
            let stranger = Credentials {
                user: "luigi".into(),
                ..creds
            };
            let e = auth.check(Some(&token(&stranger, 1_000_000).unwrap()), 1_000_000);
            assert!(e.unwrap_err().to_string().contains("unknown user"));
        }
        for bad in [None, Some("not base64!"), Some("aGVsbG8=")] {
            assert!(matches!(auth.check(bad, 0), Err(AuthError::Refused(_))));
        }
        let long = "A".repeat(MAX_TOKEN + 1);
        assert!(auth.check(Some(&long), 0).is_err());
    }

    #[test]
    fn credentials_and_user_files_parse_as_iperf3_writes_them() {
        assert_eq!(
            parse_credentials("user: a\npwd:  b\nts:   12"),
            Some(("a".into(), "b".into(), 12))
        );
        assert_eq!(parse_credentials("user: a\npwd:  b\nts:   x"), None);
        assert_eq!(parse_credentials("user: a b\npwd:  b\nts:   1"), None);
        let users = parse_users(&format!(
            "# comment\n\nmario,{}\n",
            user_hash("mario", "rossi").to_uppercase()
        ))
        .unwrap();
        assert_eq!(users["mario"], user_hash("mario", "rossi"));
        assert!(parse_users("mario\n").unwrap_err().starts_with("line 1"));
        assert!(parse_users("mario,abc\n").unwrap_err().contains("64 hex"));
        assert!(parse_users("# only\n").is_err());
    }

    #[test]
    fn extreme_timestamps_parse_or_are_refused_without_overflow() {
        let creds = |ts: &str| parse_credentials(&format!("user: u\npwd: p\nts: {ts}"));
        assert_eq!(creds(&i64::MIN.to_string()).map(|c| c.2), Some(i64::MIN));
        assert_eq!(creds(&i64::MAX.to_string()).map(|c| c.2), Some(i64::MAX));
        assert_eq!(creds("9223372036854775808"), None);
        assert_eq!(creds("-9223372036854775809"), None);
        assert_eq!(creds(&u64::MAX.to_string()), None);
        // The skew check is abs_diff: the widest gap fits in a u64.
        assert_eq!(i64::MAX.abs_diff(i64::MIN), u64::MAX);
    }
}
