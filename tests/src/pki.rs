//! Certificates for the TLS tests.

/// In `dir`: a CA (`ca.crt`), a server certificate for 127.0.0.1 and localhost
/// (`server.crt`, `server.key`), one for another name (`elsewhere.*`) and a client
/// certificate (`client.*`), made with openssl.
pub fn make_pki(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
    ]);
    // Extensions make version 3 certificates, the only version webpki accepts.
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("elsewhere.ext"),
        "subjectAltName=DNS:elsewhere.example\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for name in ["server", "client", "elsewhere"] {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        let ext = format!("{name}.ext");
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    }
}
