//! Envoy Gateway's certificates, laid out as it mounts them: one CA (`envoy-gateway`)
//! signing the control plane's certificate, Envoy's and the rate limit deployment's
//! (its Secret `envoy-rate-limit`: `ca.crt`, `tls.crt`, `tls.key`, mounted at `/certs`).
//! The names are those Envoy Gateway's certificate generator gives on Kubernetes in the
//! `envoy-gateway-system` namespace, plus `localhost`, which it gives when it runs on a
//! host, so that the loopback address of the test's control plane is verified too.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

/// The namespace Envoy Gateway's names are made in.
const NAMESPACE: &str = "envoy-gateway-system";

/// Writes under `root`: `certs/` (the rate limit deployment's Secret), `envoy-gateway/`
/// (the control plane's `tls.crt`, `tls.key`, `ca.crt`) and `envoy/` (Envoy's).
pub fn make_envoy_gateway_pki(root: &Path) {
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "envoy-gateway");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let control_plane: Vec<String> = [
        "envoy-gateway".to_owned(),
        format!("envoy-gateway.{NAMESPACE}"),
        format!("envoy-gateway.{NAMESPACE}.svc"),
        format!("envoy-gateway.{NAMESPACE}.svc.cluster.local"),
        "localhost".to_owned(),
    ]
    .into();
    let envoy = vec![format!("*.{NAMESPACE}"), "localhost".to_owned()];
    for (dir, common_name, names) in [
        ("envoy-gateway", "envoy-gateway", &control_plane),
        ("envoy", "envoy", &envoy),
        ("certs", "envoy", &envoy),
    ] {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.subject_alt_names = names
            .iter()
            .map(|n| SanType::DnsName(n.as_str().try_into().unwrap()))
            .collect();
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &ca).unwrap();
        let dir = root.join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
        std::fs::write(dir.join("tls.crt"), certificate.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }
}
