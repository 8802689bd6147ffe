//! Bearer tokens: JSON Web Tokens (RFC 7519) with the WLCG common JWT
//! profile's claims, signed with HMAC-SHA256 (`HS256`) under a key
//! derived from the server's pre-shared key.
//!
//! A storage admin reads one as any WLCG token: `iss`, `sub`, `aud`,
//! `exp`, `nbf`, `iat`, `jti`, `wlcg.ver` and a space-separated `scope` of
//! `storage.read:/PATH`, `storage.create:/PATH`, `storage.modify:/PATH`,
//! where `/PATH` is the URL path on this server (`/EXPORT/dir`; `/` is
//! every export). A scope covers its path and everything beneath it at
//! *path-component* boundaries: `storage.read:/data/a` covers `/data/a`
//! and `/data/a/x`, never `/data/ab`. `storage.modify` implies
//! `storage.create` (the profile's rule); reading needs `storage.read`.
//!
//! Two kinds of signer are trusted. The server's own tokens are `HS256`
//! under a key derived from its pre-shared key: `fatpipe token` mints
//! them ([`mint`]). An external issuer's (an IAM, a SciTokens issuer) are
//! `RS256` or `ES256` under the public keys of that issuer's JWKS file
//! (`--http-issuer ISS=JWKS`, [`Issuer`]): its `iss` picks the key set,
//! its `kid` the key. No other algorithm is accepted (no `none`, no HMAC
//! under a public key), the signature is checked before any claim but
//! `iss` is believed, and the whole token is capped at [`MAX_TOKEN`]
//! bytes. Simple sites can also list static tokens with their scopes in a
//! file (`--http-token-file`, [`parse_token_file`]), kept as SHA-256
//! hashes. The server verifies all of them with one [`Verifier`].

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The longest token considered (header, claims and signature).
pub const MAX_TOKEN: usize = 8 * 1024;
/// The most scopes read from one token.
pub const MAX_SCOPES: usize = 64;
/// The audience every WLCG-profile verifier accepts.
pub const ANY_AUDIENCE: &str = "https://wlcg.cern.ch/jwt/v1/any";
/// The audience of tokens minted without `--aud`, and the one a server
/// accepts without `--http-audience`.
pub const DEFAULT_AUDIENCE: &str = "fatpipe";
/// The issuer minted tokens name.
pub const ISSUER: &str = "fatpipe";
/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_S: u64 = 60;

/// What a scope lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Perm {
    /// GET, HEAD, PROPFIND.
    Read,
    /// PUT of a new file, MKCOL.
    Create,
    /// Everything that changes or removes what exists (PUT over a file,
    /// DELETE, MOVE); implies `Create`.
    Modify,
}

impl Perm {
    /// The WLCG scope name.
    pub fn name(self) -> &'static str {
        match self {
            Perm::Read => "storage.read",
            Perm::Create => "storage.create",
            Perm::Modify => "storage.modify",
        }
    }
}

/// One `storage.*:/path` scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// What it allows.
    pub perm: Perm,
    /// The path prefix, normalised: starts with `/`, no trailing `/`
    /// (except the root, `/`), no empty, `.` or `..` component.
    pub path: String,
}

impl Scope {
    /// Parses `storage.read:/path` (a scope of another kind is `None`: it
    /// grants nothing here, and is not an error).
    pub fn parse(s: &str) -> Option<Scope> {
        let (kind, path) = s.split_once(':').unwrap_or((s, "/"));
        let perm = match kind {
            "storage.read" => Perm::Read,
            "storage.create" => Perm::Create,
            "storage.modify" => Perm::Modify,
            _ => return None,
        };
        Some(Scope {
            perm,
            path: normalise(path)?,
        })
    }

    /// Whether this scope lets its holder do `perm` on the URL path `path`
    /// (already percent-decoded and normalised the same way).
    pub fn allows(&self, perm: Perm, path: &str) -> bool {
        let perm_ok = match perm {
            Perm::Read => self.perm == Perm::Read,
            Perm::Create => matches!(self.perm, Perm::Create | Perm::Modify),
            Perm::Modify => self.perm == Perm::Modify,
        };
        perm_ok && covers(&self.path, path)
    }
}

/// Whether the path prefix `prefix` covers `path` at a component
/// boundary (both normalised).
pub fn covers(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// A path as scopes compare it: leading `/`, single slashes, no trailing
/// `/` except for the root; `None` if it has a `.` or `..` component.
pub fn normalise(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut out = String::with_capacity(path.len());
    for c in path.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return None;
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// The claims of a token, as minted and as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who issued it.
    pub iss: String,
    /// Whom it was issued to.
    #[serde(default)]
    pub sub: String,
    /// The audience(s) it is for.
    pub aud: Audience,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Not valid before, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Issued at, seconds since the epoch.
    #[serde(default)]
    pub iat: u64,
    /// A unique id.
    #[serde(default)]
    pub jti: String,
    /// Space-separated `storage.*:/path` scopes.
    #[serde(default)]
    pub scope: String,
    /// The WLCG profile version.
    #[serde(rename = "wlcg.ver", default)]
    pub wlcg_ver: String,
}

/// `aud`: one string or a list (RFC 7519 §4.1.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    /// One audience.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Audience {
    fn contains(&self, a: &str) -> bool {
        match self {
            Audience::One(x) => x == a,
            Audience::Many(v) => v.iter().any(|x| x == a),
        }
    }
}

/// Why a token was not accepted (the text goes to the client in the 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts, bad JSON, too long.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// An algorithm this server does not accept from this signer.
    #[error("token algorithm {0:?} is not accepted (HS256 from this server, RS256/ES256 from a configured issuer)")]
    Algorithm(String),
    /// An issuer this server does not trust.
    #[error("token issuer is not one this server trusts (--http-issuer)")]
    Issuer,
    /// The signature does not verify under this server's key.
    #[error("token signature does not verify (not minted with this server's key)")]
    Signature,
    /// Past `exp`.
    #[error("token expired")]
    Expired,
    /// Before `nbf`.
    #[error("token not yet valid (nbf)")]
    NotYetValid,
    /// `aud` names no audience this server accepts.
    #[error("token audience is not this server's")]
    Audience,
}

/// What a verified token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Its scopes.
    pub scopes: Vec<Scope>,
    /// Its subject (for the log).
    pub sub: String,
}

impl Grant {
    /// Whether some scope allows `perm` on `path`.
    pub fn allows(&self, perm: Perm, path: &str) -> bool {
        self.scopes.iter().any(|s| s.allows(perm, path))
    }
}

/// An external token issuer: its `iss` and the public keys of its JWKS.
#[derive(Debug, Clone)]
pub struct Issuer {
    /// The `iss` its tokens carry.
    pub iss: String,
    keys: Vec<Jwk>,
}

/// One public key of a JWKS.
#[derive(Debug, Clone)]
struct Jwk {
    kid: Option<String>,
    key: PublicKey,
}

#[derive(Debug, Clone)]
enum PublicKey {
    /// RS256: modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// ES256: the uncompressed P-256 point (`04 || x || y`).
    P256(Vec<u8>),
}

/// The largest JWKS document read.
pub const MAX_JWKS: usize = 1024 * 1024;

impl Issuer {
    /// An issuer `iss` whose keys are the JWKS document `jwks` (RFC 7517:
    /// `{"keys": [...]}`; RSA keys with `n`, `e`, P-256 EC keys with `x`,
    /// `y`; other keys are skipped). Fails when no usable key is left.
    pub fn from_jwks(iss: &str, jwks: &[u8]) -> Result<Issuer, String> {
        if jwks.len() > MAX_JWKS {
            return Err(format!("the JWKS is larger than {MAX_JWKS} bytes"));
        }
        #[derive(Deserialize)]
        struct Doc {
            keys: Vec<RawJwk>,
        }
        #[derive(Deserialize)]
        struct RawJwk {
            kty: String,
            #[serde(default)]
            kid: Option<String>,
            #[serde(default)]
            crv: Option<String>,
            #[serde(default)]
            n: Option<String>,
            #[serde(default)]
            e: Option<String>,
            #[serde(default)]
            x: Option<String>,
            #[serde(default)]
            y: Option<String>,
        }
        let doc: Doc = serde_json::from_slice(jwks).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut keys = Vec::new();
        for k in doc.keys {
            let key = match (k.kty.as_str(), k.crv.as_deref()) {
                ("RSA", _) => match (k.n.as_deref().map(b64), k.e.as_deref().map(b64)) {
                    (Some(Ok(n)), Some(Ok(e))) => PublicKey::Rsa { n, e },
                    _ => continue,
                },
                ("EC", Some("P-256")) => match (k.x.as_deref().map(b64), k.y.as_deref().map(b64)) {
                    (Some(Ok(x)), Some(Ok(y))) if x.len() == 32 && y.len() == 32 => {
                        let mut p = vec![4u8];
                        p.extend_from_slice(&x);
                        p.extend_from_slice(&y);
                        PublicKey::P256(p)
                    }
                    _ => continue,
                },
                _ => continue,
            };
            keys.push(Jwk { kid: k.kid, key });
        }
        if keys.is_empty() {
            return Err("the JWKS has no RSA or P-256 key".into());
        }
        Ok(Issuer {
            iss: iss.to_string(),
            keys,
        })
    }

    /// Whether one of its keys (the one named `kid`, if given) signed
    /// `signed` with `sig` under `alg`.
    fn verifies(&self, alg: &str, kid: Option<&str>, signed: &[u8], sig: &[u8]) -> bool {
        self.keys
            .iter()
            .filter(|k| kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
            .any(|k| match (&k.key, alg) {
                (PublicKey::Rsa { n, e }, "RS256") => ring::signature::RsaPublicKeyComponents {
                    n: n.as_slice(),
                    e: e.as_slice(),
                }
                .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed, sig)
                .is_ok(),
                (PublicKey::P256(p), "ES256") => ring::signature::UnparsedPublicKey::new(
                    &ring::signature::ECDSA_P256_SHA256_FIXED,
                    p.as_slice(),
                )
                .verify(signed, sig)
                .is_ok(),
                _ => false,
            })
    }
}

/// The shortest static token accepted from a token file.
pub const MIN_STATIC: usize = 16;

/// A static token of a token file (`--http-token-file`): kept as its
/// SHA-256, with the scopes it grants. For simple sites: such a token
/// never expires; it is revoked by removing its line.
#[derive(Debug, Clone)]
pub struct StaticToken {
    hash: [u8; 32],
    scopes: Vec<Scope>,
    name: String,
}

/// Parses a token file: one token per line, `TOKEN SCOPE [SCOPE...]`
/// (scopes as in JWTs: `storage.read:/data`), `#` comments and blank lines
/// ignored. Every error names its line.
pub fn parse_token_file(text: &str) -> Result<Vec<StaticToken>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_ascii_whitespace();
        let token = words.next().unwrap_or_default();
        if token.len() < MIN_STATIC {
            return Err(format!(
                "line {}: a token of at least {MIN_STATIC} characters first",
                i + 1
            ));
        }
        let mut scopes = Vec::new();
        for w in words {
            scopes.push(Scope::parse(w).ok_or_else(|| {
                format!(
                    "line {}: '{w}' is not a storage.read/create/modify:/PATH scope",
                    i + 1
                )
            })?);
        }
        if scopes.is_empty() {
            return Err(format!("line {}: the token grants no scope", i + 1));
        }
        out.push(StaticToken {
            hash: sha256(token.as_bytes()),
            scopes,
            name: format!("static token of line {}", i + 1),
        });
    }
    Ok(out)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let mut h = [0u8; 32];
    h.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, b).as_ref());
    h
}

/// Checks tokens against the server's key, the trusted issuers, the static
/// tokens and the audiences.
#[derive(Clone)]
pub struct Verifier {
    key: Option<ring::hmac::Key>,
    issuers: Vec<Issuer>,
    statics: Vec<StaticToken>,
    audiences: Vec<String>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("own_key", &self.key.is_some())
            .field(
                "issuers",
                &self.issuers.iter().map(|i| &i.iss).collect::<Vec<_>>(),
            )
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier for tokens minted from the server's pre-shared key
    /// `psk`, accepting `audiences` (and the WLCG "any" audience).
    pub fn new(psk: &[u8], audiences: Vec<String>) -> Verifier {
        Verifier {
            key: Some(token_key(psk)),
            issuers: Vec::new(),
            statics: Vec::new(),
            audiences,
        }
    }

    /// A verifier of external issuers' and static tokens only (a server
    /// without a pre-shared key).
    pub fn without_key(audiences: Vec<String>) -> Verifier {
        Verifier {
            key: None,
            issuers: Vec::new(),
            statics: Vec::new(),
            audiences,
        }
    }

    /// Also accepts these static tokens.
    pub fn with_static(mut self, tokens: Vec<StaticToken>) -> Verifier {
        self.statics.extend(tokens);
        self
    }

    /// Also trusts `issuer`'s tokens.
    pub fn trust(mut self, issuer: Issuer) -> Verifier {
        self.issuers.push(issuer);
        self
    }

    /// Verifies `token` at `now` (seconds since the epoch).
    pub fn verify(&self, token: &str, now: u64) -> Result<Grant, TokenError> {
        if token.len() > MAX_TOKEN {
            return Err(TokenError::Malformed("too long"));
        }
        if !self.statics.is_empty() {
            let h = sha256(token.as_bytes());
            if let Some(st) = self.statics.iter().find(|s| s.hash == h) {
                return Ok(Grant {
                    scopes: st.scopes.clone(),
                    sub: st.name.clone(),
                });
            }
        }
        let mut parts = token.split('.');
        let (Some(h), Some(c), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("not three dot-separated parts"));
        };
        let header: Header = serde_json::from_slice(&b64(h)?)
            .map_err(|_| TokenError::Malformed("header is not JSON"))?;
        let sig = b64(sig)?;
        let signed = &token[..h.len() + 1 + c.len()];
        let body = b64(c)?;
        match header.alg.as_str() {
            "HS256" => {
                let key = self
                    .key
                    .as_ref()
                    .ok_or_else(|| TokenError::Algorithm("HS256".into()))?;
                ring::hmac::verify(key, signed.as_bytes(), &sig)
                    .map_err(|_| TokenError::Signature)?;
            }
            "RS256" | "ES256" => {
                // Only `iss` is read before the signature is checked: it
                // names the key set to check it with.
                #[derive(Deserialize)]
                struct Iss {
                    iss: String,
                }
                let iss: Iss = serde_json::from_slice(&body)
                    .map_err(|_| TokenError::Malformed("claims have no iss"))?;
                let issuer = self
                    .issuers
                    .iter()
                    .find(|i| i.iss == iss.iss)
                    .ok_or(TokenError::Issuer)?;
                if !issuer.verifies(&header.alg, header.kid.as_deref(), signed.as_bytes(), &sig) {
                    return Err(TokenError::Signature);
                }
            }
            other => return Err(TokenError::Algorithm(other.chars().take(16).collect())),
        }
        let claims: Claims = serde_json::from_slice(&body)
            .map_err(|_| TokenError::Malformed("claims are not the expected JSON"))?;
        if now > claims.exp.saturating_add(LEEWAY_S) {
            return Err(TokenError::Expired);
        }
        if claims
            .nbf
            .is_some_and(|nbf| now.saturating_add(LEEWAY_S) < nbf)
        {
            return Err(TokenError::NotYetValid);
        }
        if !claims.aud.contains(ANY_AUDIENCE)
            && !self.audiences.iter().any(|a| claims.aud.contains(a))
        {
            return Err(TokenError::Audience);
        }
        let scopes = claims
            .scope
            .split_ascii_whitespace()
            .take(MAX_SCOPES)
            .filter_map(Scope::parse)
            .collect();
        Ok(Grant {
            scopes,
            sub: claims.sub,
        })
    }
}

/// Mints a token for `claims` under the key derived from `psk`.
pub fn mint(psk: &[u8], claims: &Claims) -> String {
    let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let header = enc(br#"{"alg":"HS256","typ":"JWT"}"#);
    // Serialising these plain fields cannot fail.
    let body = enc(&serde_json::to_vec(claims).unwrap_or_default());
    let signed = format!("{header}.{body}");
    let tag = ring::hmac::sign(&token_key(psk), signed.as_bytes());
    format!("{signed}.{}", enc(tag.as_ref()))
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// The HMAC key tokens are signed with: derived from the pre-shared key
/// under its own label, so a token's signature never doubles as a
/// handshake proof of the fatpipe protocol.
fn token_key(psk: &[u8]) -> ring::hmac::Key {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, psk);
    let derived = ring::hmac::sign(&k, b"fatpipe/1 http bearer token key");
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref())
}

fn b64(s: &str) -> Result<Vec<u8>, TokenError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| TokenError::Malformed("not base64url"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSK: &[u8] = b"an example pre-shared key";

    fn claims(scope: &str, aud: &str, exp: u64) -> Claims {
        Claims {
            iss: ISSUER.into(),
            sub: "alice".into(),
            aud: Audience::One(aud.into()),
            exp,
            nbf: Some(900),
            iat: 1000,
            jti: "1".into(),
            scope: scope.into(),
            wlcg_ver: "1.0".into(),
        }
    }

    fn verifier() -> Verifier {
        Verifier::new(PSK, vec![DEFAULT_AUDIENCE.into()])
    }

    #[test]
    fn a_minted_token_verifies_and_grants_its_scopes_at_path_boundaries() {
        let t = mint(
            PSK,
            &claims("storage.read:/data/a storage.modify:/up", "fatpipe", 2000),
        );
        let g = verifier().verify(&t, 1500).unwrap();
        assert_eq!(g.sub, "alice");
        assert!(g.allows(Perm::Read, "/data/a"));
        assert!(g.allows(Perm::Read, "/data/a/x/y"));
        assert!(
            !g.allows(Perm::Read, "/data/ab"),
            "a string prefix is not a path prefix"
        );
        assert!(!g.allows(Perm::Read, "/data"));
        assert!(!g.allows(Perm::Create, "/data/a/x"), "read does not write");
        assert!(g.allows(Perm::Create, "/up/new"), "modify implies create");
        assert!(g.allows(Perm::Modify, "/up"));
        assert!(
            !g.allows(Perm::Read, "/up/new"),
            "modify does not imply read"
        );
    }

    #[test]
    fn expiry_audience_and_signature_are_enforced() {
        let v = verifier();
        let t = mint(PSK, &claims("storage.read:/", "fatpipe", 2000));
        assert_eq!(v.verify(&t, 2000 + LEEWAY_S + 1), Err(TokenError::Expired));
        assert_eq!(
            v.verify(&t, 900 - LEEWAY_S - 1),
            Err(TokenError::NotYetValid)
        );
        let other = mint(
            PSK,
            &claims("storage.read:/", "https://other.example", 2000),
        );
        assert_eq!(v.verify(&other, 1500), Err(TokenError::Audience));
        let any = mint(PSK, &claims("storage.read:/", ANY_AUDIENCE, 2000));
        assert!(v.verify(&any, 1500).is_ok());
        let forged = mint(
            b"another key entirely",
            &claims("storage.read:/", "fatpipe", 2000),
        );
        assert_eq!(v.verify(&forged, 1500), Err(TokenError::Signature));
        // A token whose claims were edited after signing.
        let mut parts: Vec<String> = t.split('.').map(String::from).collect();
        parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&claims("storage.modify:/", "fatpipe", 9999)).unwrap());
        assert_eq!(v.verify(&parts.join("."), 1500), Err(TokenError::Signature));
    }

    #[test]
    fn unsigned_and_malformed_tokens_are_refused() {
        let v = verifier();
        let none = format!(
            "{}.{}.",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::to_vec(&claims("storage.read:/", "fatpipe", 9999)).unwrap())
        );
        assert!(matches!(
            v.verify(&none, 1500),
            Err(TokenError::Algorithm(_))
        ));
        for bad in ["", "a.b", "a.b.c.d", "!!.!!.!!", &"x".repeat(MAX_TOKEN + 1)] {
            assert!(
                matches!(v.verify(bad, 1500), Err(TokenError::Malformed(_))),
                "{bad:.20}"
            );
        }
    }

    /// An ES256 token signed by `pair` for issuer `iss`.
    fn es256(pair: &ring::signature::EcdsaKeyPair, kid: &str, claims: &Claims) -> String {
        let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let header = enc(format!(r#"{{"alg":"ES256","typ":"JWT","kid":"{kid}"}}"#).as_bytes());
        let body = enc(&serde_json::to_vec(claims).unwrap());
        let signed = format!("{header}.{body}");
        let rng = ring::rand::SystemRandom::new();
        let sig = pair.sign(&rng, signed.as_bytes()).unwrap();
        format!("{signed}.{}", enc(sig.as_ref()))
    }

    fn p256() -> (ring::signature::EcdsaKeyPair, String) {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let p = pair.public_key().as_ref().to_vec();
        let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let jwks = format!(
            r#"{{"keys":[{{"kty":"oct","k":"x"}},{{"kty":"EC","crv":"P-256","kid":"k1","x":"{}","y":"{}"}}]}}"#,
            enc(&p[1..33]),
            enc(&p[33..65])
        );
        (pair, jwks)
    }

    #[test]
    fn an_external_issuers_es256_token_verifies_under_its_jwks_only() {
        let (pair, jwks) = p256();
        let iss = "https://iam.example/";
        let issuer = Issuer::from_jwks(iss, jwks.as_bytes()).unwrap();
        let v = Verifier::without_key(vec!["fatpipe".into()]).trust(issuer);
        let mut c = claims("storage.read:/data", "fatpipe", 2000);
        c.iss = iss.into();
        let t = es256(&pair, "k1", &c);
        assert!(v.verify(&t, 1500).unwrap().allows(Perm::Read, "/data/x"));
        assert_eq!(
            v.verify(&es256(&pair, "other", &c), 1500),
            Err(TokenError::Signature)
        );
        let mut stranger = c.clone();
        stranger.iss = "https://elsewhere.example/".into();
        assert_eq!(
            v.verify(&es256(&pair, "k1", &stranger), 1500),
            Err(TokenError::Issuer)
        );
        let (other_pair, _) = p256();
        assert_eq!(
            v.verify(&es256(&other_pair, "k1", &c), 1500),
            Err(TokenError::Signature)
        );
        // The server's own tokens need its key, which this one lacks.
        let own = mint(PSK, &claims("storage.read:/", "fatpipe", 2000));
        assert!(matches!(
            v.verify(&own, 1500),
            Err(TokenError::Algorithm(_))
        ));
        assert!(Issuer::from_jwks(iss, br#"{"keys":[{"kty":"oct","k":"x"}]}"#).is_err());
        assert!(Issuer::from_jwks(iss, b"[]").is_err());
    }

    #[test]
    fn static_tokens_grant_their_line_and_nothing_else() {
        let file = "# site tokens\n\nreader-0123456789abcdef storage.read:/data\n\
                    writer-0123456789abcdef storage.modify:/data/in storage.read:/data/in\n";
        let v = Verifier::without_key(vec![]).with_static(parse_token_file(file).unwrap());
        let g = v.verify("reader-0123456789abcdef", 0).unwrap();
        assert!(g.allows(Perm::Read, "/data/x") && !g.allows(Perm::Create, "/data/x"));
        let g = v.verify("writer-0123456789abcdef", 0).unwrap();
        assert!(g.allows(Perm::Modify, "/data/in/x") && !g.allows(Perm::Read, "/data/x"));
        assert!(v.verify("reader-0123456789abcdeX", 0).is_err());
        assert!(parse_token_file("short storage.read:/")
            .unwrap_err()
            .contains("line 1"));
        assert!(parse_token_file("0123456789abcdefgh")
            .unwrap_err()
            .contains("no scope"));
        assert!(parse_token_file("0123456789abcdefgh storage.write:/").is_err());
    }

    #[test]
    fn scopes_parse_and_normalise() {
        let s = Scope::parse("storage.read:/a//b/").unwrap();
        assert_eq!(s.path, "/a/b");
        assert_eq!(Scope::parse("storage.modify").unwrap().path, "/");
        assert_eq!(Scope::parse("storage.read:/a/../b"), None);
        assert_eq!(Scope::parse("storage.read:a"), None);
        assert_eq!(Scope::parse("compute.read:/"), None);
        assert!(covers("/", "/anything"));
        assert!(covers("/a", "/a"));
        assert!(!covers("/a", "/ab"));
    }
}
