//! Certificates for the TLS tests, made with rcgen.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The DNS name in the client certificate (`client.crt`).
pub const CLIENT_NAME: &str = "client.test";

/// A new temporary directory holding [`make_pki`]'s files.
pub fn temp_pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path());
    dir
}

/// In `dir`: a CA (`ca.crt`), a server certificate for 127.0.0.1 and localhost
/// (`server.crt`, `server.key`), one for another name only (`elsewhere.*`) and a client
/// certificate for [`CLIENT_NAME`] (`client.*`). Each call makes a new CA.
pub fn make_pki(dir: &Path) {
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    let localhost = [
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::DnsName("localhost".try_into().unwrap()),
    ];
    let elsewhere = [SanType::DnsName("elsewhere.example".try_into().unwrap())];
    let client = [SanType::DnsName(CLIENT_NAME.try_into().unwrap())];
    for (name, names, usage) in [
        (
            "server",
            &localhost[..],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        (
            "elsewhere",
            &elsewhere[..],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        ("client", &client[..], ExtendedKeyUsagePurpose::ClientAuth),
    ] {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names = names.to_vec();
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), certificate.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}
