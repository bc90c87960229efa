//! The handshake's cryptography: proving the auth token and a client's reconnect key without
//! sending either.
//!
//! HELLO's response carries a random [`NONCE_LEN`]-byte nonce from the donor. AUTH answers it
//! with `HMAC-SHA256(token, "farmem-auth-v2" ‖ nonce ‖ client_id)` ([`token_proof`]), so the
//! token never crosses the wire and a recorded proof is useless on another connection (another
//! nonce). A client's slabs belong to its [`ReconnectKey`], a random secret the client registers
//! once (AUTH mode register); every later connection of that client proves it with
//! `HMAC-SHA256(key, "farmem-attach-v2" ‖ nonce ‖ client_id)` ([`attach_proof`]). Proofs are
//! compared in constant time ([`proofs_match`]).
use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Length of the donor's challenge nonce, in bytes.
pub const NONCE_LEN: usize = 32;
/// Length of a proof (an HMAC-SHA256), in bytes.
pub const PROOF_LEN: usize = 32;
/// Length of a reconnect key, in bytes.
pub const KEY_LEN: usize = 32;

/// Why a random value could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random number generator failed ({0}); farmem cannot create secrets without it")]
pub struct RandomError(String);

/// Fills `buf` from the operating system's random number generator.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), RandomError> {
    getrandom::getrandom(buf).map_err(|e| RandomError(e.to_string()))
}

/// A random 64-bit client id (an id is a name, not a secret: the [`ReconnectKey`] guards it).
pub fn random_client_id() -> Result<u64, RandomError> {
    let mut b = [0u8; 8];
    random_bytes(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// The secret a client's slabs belong to. Its `Debug` output hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct ReconnectKey(pub [u8; KEY_LEN]);

impl ReconnectKey {
    /// A fresh random key.
    pub fn random() -> Result<ReconnectKey, RandomError> {
        let mut k = [0u8; KEY_LEN];
        random_bytes(&mut k)?;
        Ok(ReconnectKey(k))
    }
}

impl fmt::Debug for ReconnectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReconnectKey(<redacted>)")
    }
}

/// The token a token file's bytes hold: the bytes with one trailing newline (`\n` or `\r\n`)
/// removed, so `echo secret > tok` holds the token `secret`. Both ends apply it before proving
/// or checking a token.
pub fn token_from_file_bytes(bytes: &[u8]) -> &[u8] {
    let b = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if b.len() < bytes.len() {
        b.strip_suffix(b"\r").unwrap_or(b)
    } else {
        b
    }
}

fn mac(key: &[u8], label: &[u8], nonce: &[u8; NONCE_LEN], client_id: u64) -> [u8; PROOF_LEN] {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(label);
    m.update(nonce);
    m.update(&client_id.to_le_bytes());
    m.finalize().into_bytes().into()
}

/// The proof that the client holds `token` (empty when the client has none; one trailing
/// newline is not part of the token, see [`token_from_file_bytes`]).
pub fn token_proof(token: &[u8], nonce: &[u8; NONCE_LEN], client_id: u64) -> [u8; PROOF_LEN] {
    mac(
        token_from_file_bytes(token),
        b"farmem-auth-v2",
        nonce,
        client_id,
    )
}

/// The proof that the client holds `key`, the reconnect key `client_id` was registered with.
pub fn attach_proof(
    key: &ReconnectKey,
    nonce: &[u8; NONCE_LEN],
    client_id: u64,
) -> [u8; PROOF_LEN] {
    mac(&key.0, b"farmem-attach-v2", nonce, client_id)
}

/// Whether two proofs are equal, in time independent of their contents.
pub fn proofs_match(a: &[u8; PROOF_LEN], b: &[u8; PROOF_LEN]) -> bool {
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_every_input() {
        let n = [7u8; NONCE_LEN];
        let p = token_proof(b"secret", &n, 1);
        assert!(proofs_match(&p, &token_proof(b"secret", &n, 1)));
        assert!(!proofs_match(&p, &token_proof(b"secret!", &n, 1)));
        assert!(!proofs_match(
            &p,
            &token_proof(b"secret", &[8u8; NONCE_LEN], 1)
        ));
        assert!(!proofs_match(&p, &token_proof(b"secret", &n, 2)));
        let k = ReconnectKey([1u8; KEY_LEN]);
        assert!(!proofs_match(
            &attach_proof(&k, &n, 1),
            &token_proof(&k.0, &n, 1)
        ));
        assert_eq!(format!("{k:?}"), "ReconnectKey(<redacted>)");
    }

    #[test]
    fn one_trailing_newline_is_not_part_of_the_token() {
        assert_eq!(token_from_file_bytes(b"secret\n"), b"secret");
        assert_eq!(token_from_file_bytes(b"secret\r\n"), b"secret");
        assert_eq!(token_from_file_bytes(b"secret\n\n"), b"secret\n");
        assert_eq!(token_from_file_bytes(b"secret\r"), b"secret\r");
        assert_eq!(token_from_file_bytes(b"\n"), b"");
        let n = [1u8; NONCE_LEN];
        assert_eq!(token_proof(b"s\n", &n, 1), token_proof(b"s", &n, 1));
    }

    #[test]
    fn random_values_differ() {
        assert_ne!(
            ReconnectKey::random().unwrap(),
            ReconnectKey::random().unwrap()
        );
        assert_ne!(random_client_id().unwrap(), random_client_id().unwrap());
    }
}
