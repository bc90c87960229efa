//! IDENT's label and CLIENTS' answer: who a donor's clients are, for operators.
//!
//! A client names itself once per connection (IDENT: its program and host, as it sees them;
//! the donor adds the address it connects from). CLIENTS answers with the asking client's
//! tenant — its use and quota — and that tenant's clients only, so one tenant never learns
//! another's programs or hosts.
//!
//! CLIENTS' payload (little-endian): `tenant_len u8, tenant[tenant_len], tenant_used_bytes u64,
//! tenant_quota_bytes u64 (u64::MAX: none), count u16, count × entry`, an entry being
//! `client_id u64, connections u16, slabs u32, used_bytes u64, flags u8 (bit 0: orphaned),
//! address[16] (IPv6; IPv4 mapped), label_len u8, label[label_len]`. Decoding checks every
//! length and every string before the list is handed out, so iterating cannot fail.

use std::net::{IpAddr, Ipv6Addr};

use crate::DecodeError;

/// The longest IDENT label, bytes.
pub const MAX_LABEL_LEN: usize = 96;
/// The most clients one CLIENTS answer lists (the donor's connection bound).
pub const MAX_CLIENTS_LISTED: usize = 1024;
/// The longest tenant name on the wire, bytes.
pub const MAX_TENANT_NAME_LEN: usize = 64;

/// Why a label is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// Empty or longer than [`MAX_LABEL_LEN`].
    #[error("a client label is 1 to {MAX_LABEL_LEN} bytes, not {0}")]
    Length(usize),
    /// Not UTF-8, or with control characters (it is printed in tables and logs).
    #[error("a client label is printable UTF-8 text")]
    Text,
}

/// Checks an IDENT label: 1 to [`MAX_LABEL_LEN`] bytes of UTF-8 without control characters.
pub fn check_label(raw: &[u8]) -> Result<&str, LabelError> {
    if raw.is_empty() || raw.len() > MAX_LABEL_LEN {
        return Err(LabelError::Length(raw.len()));
    }
    let s = std::str::from_utf8(raw).map_err(|_| LabelError::Text)?;
    if s.chars().any(char::is_control) {
        return Err(LabelError::Text);
    }
    Ok(s)
}

/// Cuts `label` to a valid one: control characters replaced, at most [`MAX_LABEL_LEN`] bytes
/// on a character boundary; `None` when nothing is left.
pub fn clean_label(label: &str) -> Option<String> {
    let mut s: String = label
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let mut end = s.len().min(MAX_LABEL_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    (!s.is_empty()).then_some(s)
}

/// One client of the asking tenant, as CLIENTS tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientEntry {
    /// The client's id.
    pub client_id: u64,
    /// Its open connections.
    pub connections: u16,
    /// Slabs it holds.
    pub slabs: u32,
    /// Bytes of those slabs.
    pub used_bytes: u64,
    /// It has no connection now (its slabs wait out the orphan grace).
    pub orphaned: bool,
    /// The address its last connection came from (unspecified if not known).
    pub address: IpAddr,
    /// What it said it is (IDENT: program and host), empty if it did not say.
    pub label: String,
}

/// CLIENTS' answer, owned (the donor builds one; a client decodes one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientsReply {
    /// The asking client's tenant.
    pub tenant: String,
    /// Bytes its clients hold.
    pub tenant_used_bytes: u64,
    /// Its quota, if it has one.
    pub tenant_quota_bytes: Option<u64>,
    /// Its clients (at most [`MAX_CLIENTS_LISTED`]).
    pub clients: Vec<ClientEntry>,
}

fn mapped(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn unmapped(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

impl ClientsReply {
    /// The payload: the tenant name cut to [`MAX_TENANT_NAME_LEN`] bytes, at most
    /// [`MAX_CLIENTS_LISTED`] clients, labels made valid ([`clean_label`]).
    pub(crate) fn encode_payload(&self, out: &mut Vec<u8>) {
        let tenant = clean_label(&self.tenant).unwrap_or_default();
        let mut end = tenant.len().min(MAX_TENANT_NAME_LEN);
        while !tenant.is_char_boundary(end) {
            end -= 1;
        }
        out.push(end as u8);
        out.extend_from_slice(&tenant.as_bytes()[..end]);
        out.extend_from_slice(&self.tenant_used_bytes.to_le_bytes());
        out.extend_from_slice(&self.tenant_quota_bytes.unwrap_or(u64::MAX).to_le_bytes());
        let listed = &self.clients[..self.clients.len().min(MAX_CLIENTS_LISTED)];
        out.extend_from_slice(&(listed.len() as u16).to_le_bytes());
        for c in listed {
            out.extend_from_slice(&c.client_id.to_le_bytes());
            out.extend_from_slice(&c.connections.to_le_bytes());
            out.extend_from_slice(&c.slabs.to_le_bytes());
            out.extend_from_slice(&c.used_bytes.to_le_bytes());
            out.push(u8::from(c.orphaned));
            out.extend_from_slice(&mapped(c.address));
            let label = clean_label(&c.label).unwrap_or_default();
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
    }

    /// Decodes CLIENTS' payload, checking every length and string.
    pub fn decode(p: &[u8]) -> Result<ClientsReply, DecodeError> {
        let mut clients = Vec::new();
        let (tenant, tenant_used_bytes, tenant_quota_bytes) = parse(p, |c, label| {
            clients.push(ClientEntry {
                label: label.to_string(),
                ..c
            });
        })?;
        Ok(ClientsReply {
            tenant: tenant.to_string(),
            tenant_used_bytes,
            tenant_quota_bytes,
            clients,
        })
    }
}

/// Checks CLIENTS' payload without allocating (the decoder's promise); see the module docs.
pub(crate) fn validate(p: &[u8]) -> Result<(), DecodeError> {
    parse(p, |_, _| {}).map(|_| ())
}

/// Walks CLIENTS' payload: `each` gets every client (its label empty) and its label; returns
/// the tenant's name, use and quota.
fn parse<'a>(
    p: &'a [u8],
    mut each: impl FnMut(ClientEntry, &'a str),
) -> Result<(&'a str, u64, Option<u64>), DecodeError> {
    let mut r = Cursor { p, at: 0 };
    let tlen = usize::from(r.u8()?);
    if tlen > MAX_TENANT_NAME_LEN {
        return Err(DecodeError::Clients("tenant name too long"));
    }
    let tenant = r.text(tlen)?;
    let tenant_used_bytes = r.u64()?;
    let quota = r.u64()?;
    let count = usize::from(r.u16()?);
    if count > MAX_CLIENTS_LISTED {
        return Err(DecodeError::Clients("too many clients"));
    }
    for _ in 0..count {
        let client_id = r.u64()?;
        let connections = r.u16()?;
        let slabs = r.u32()?;
        let used_bytes = r.u64()?;
        let flags = r.u8()?;
        if flags > 1 {
            return Err(DecodeError::Clients("unknown client flags"));
        }
        let address = unmapped(r.take(16)?.try_into().expect("16 bytes"));
        let llen = usize::from(r.u8()?);
        if llen > MAX_LABEL_LEN {
            return Err(DecodeError::Clients("label too long"));
        }
        let label = r.text(llen)?;
        each(
            ClientEntry {
                client_id,
                connections,
                slabs,
                used_bytes,
                orphaned: flags == 1,
                address,
                label: String::new(),
            },
            label,
        );
    }
    if r.at != p.len() {
        return Err(DecodeError::Clients("bytes after the last client"));
    }
    Ok((
        tenant,
        tenant_used_bytes,
        (quota != u64::MAX).then_some(quota),
    ))
}

struct Cursor<'a> {
    p: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let s = self
            .p
            .get(self.at..self.at + n)
            .ok_or(DecodeError::Clients("payload ends early"))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn text(&mut self, n: usize) -> Result<&'a str, DecodeError> {
        if n == 0 {
            return Ok("");
        }
        check_label(self.take(n)?)
            .map_err(|_| DecodeError::Clients("a name is not printable UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClientsReply {
        ClientsReply {
            tenant: "team-a".into(),
            tenant_used_bytes: 3 << 20,
            tenant_quota_bytes: Some(1 << 30),
            clients: vec![
                ClientEntry {
                    client_id: 7,
                    connections: 2,
                    slabs: 3,
                    used_bytes: 3 << 20,
                    orphaned: false,
                    address: "10.0.0.2".parse().unwrap(),
                    label: "python3 on host-a".into(),
                },
                ClientEntry {
                    client_id: 9,
                    connections: 0,
                    slabs: 0,
                    used_bytes: 0,
                    orphaned: true,
                    address: "fd00::5".parse().unwrap(),
                    label: String::new(),
                },
            ],
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        let mut p = Vec::new();
        r.encode_payload(&mut p);
        assert_eq!(ClientsReply::decode(&p).unwrap(), r);
        let none = ClientsReply {
            tenant_quota_bytes: None,
            clients: vec![],
            ..sample()
        };
        p.clear();
        none.encode_payload(&mut p);
        assert_eq!(ClientsReply::decode(&p).unwrap(), none);
    }

    #[test]
    fn every_truncation_and_bad_field_is_an_error() {
        let mut p = Vec::new();
        sample().encode_payload(&mut p);
        for n in 0..p.len() {
            assert!(ClientsReply::decode(&p[..n]).is_err(), "cut at {n}");
        }
        let mut extra = p.clone();
        extra.push(0);
        assert!(ClientsReply::decode(&extra).is_err());
        // A count far beyond the payload is refused without allocating for it.
        let mut forged = p.clone();
        let at = 1 + 6 + 16;
        forged[at..at + 2].copy_from_slice(&1000u16.to_le_bytes());
        assert!(ClientsReply::decode(&forged).is_err());
        // A control character in the tenant name.
        let mut ctl = p.clone();
        ctl[1] = b'\n';
        assert!(ClientsReply::decode(&ctl).is_err());
    }

    #[test]
    fn labels_are_checked_and_cleaned() {
        assert_eq!(check_label(b"sort on h1"), Ok("sort on h1"));
        assert_eq!(check_label(b""), Err(LabelError::Length(0)));
        assert_eq!(
            check_label(&[b'a'; MAX_LABEL_LEN + 1]),
            Err(LabelError::Length(97))
        );
        assert_eq!(check_label(b"a\x1b[2J"), Err(LabelError::Text));
        assert_eq!(check_label(&[0xff, 0xfe]), Err(LabelError::Text));
        assert_eq!(clean_label("a\nb").as_deref(), Some("a?b"));
        assert_eq!(clean_label(""), None);
        let long = "é".repeat(MAX_LABEL_LEN);
        let c = clean_label(&long).unwrap();
        assert!(c.len() <= MAX_LABEL_LEN && check_label(c.as_bytes()).is_ok());
    }
}
