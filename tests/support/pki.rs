//! Certificates made at test time: a CA, a server certificate and a
//! client certificate, as PEM.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::path::Path;

pub struct Pki {
    pub ca: String,
    pub server: (String, String),
    pub client: (String, String),
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (params, key, pem)
}

fn leaf(names: &[&str], issuer: &Issuer<'_, KeyPair>) -> (String, String) {
    let params =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    (
        params.signed_by(&key, issuer).unwrap().pem(),
        key.serialize_pem(),
    )
}

pub fn new_pki(name: &str) -> Pki {
    pki_for(name, &["localhost", "127.0.0.1"])
}

/// A CA, a broker certificate for `server_names`, and a client certificate.
pub fn pki_for(name: &str, server_names: &[&str]) -> Pki {
    let (params, key, ca_pem) = ca(name);
    let issuer = Issuer::new(params, key);
    Pki {
        ca: ca_pem,
        server: leaf(server_names, &issuer),
        client: leaf(&["geogate-client"], &issuer),
    }
}

/// Writes `text` to `dir/name`; the path.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}
