//! The certificates of every TLS test, made once per test binary with rcgen: a CA, one node
//! certificate (DNS SAN `localhost`, IP SAN `127.0.0.1`, server and client use) that Redis
//! nodes serve and present on the cluster bus, that clients present for mutual TLS and that
//! hotsplit's own HTTPS listeners serve; and a second, unrelated CA that signed nothing, the
//! untrusted one.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::OnceLock;

use hotsplit_devcluster::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The PEM files of the tests' TLS set-up, in a directory kept for the test binary's life.
pub struct Pki {
    /// The CA, the node certificate (IP SAN 127.0.0.1) and its key.
    pub files: TlsFiles,
    /// A CA that signed nothing here: trusting it alone must fail the handshake.
    pub other_ca: PathBuf,
}

/// The test binary's one [`Pki`], made on first use.
pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("hotsplit-pki-")
            .tempdir()
            .expect("pki dir")
            .keep();
        let ca = certificate_authority("hotsplit test ca");
        let node_key = KeyPair::generate().expect("node key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(DnType::CommonName, "hotsplit test node");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let node = params.signed_by(&node_key, &ca).expect("sign the node");
        let other = certificate_authority("some other ca");
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write a pem file");
            path
        };
        Pki {
            files: TlsFiles {
                ca_file: write("ca.pem", ca.pem()),
                cert_file: write("node.pem", node.pem()),
                key_file: write("node.key", node_key.serialize_pem()),
            },
            other_ca: write("other-ca.pem", other.pem()),
        }
    })
}

/// A self-signed CA named `name`.
fn certificate_authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("ca key")).expect("ca")
}
