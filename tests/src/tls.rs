//! [`TestCa`]: a throw-away certificate authority made at run time, for Redis over TLS.

use std::{fmt, fs, io, path::Path, sync::Arc};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore, pki_types::CertificateDer};

/// The CA certificate, in the server's directory (`--tls-ca-cert-file`).
pub(crate) const CA_FILE: &str = "ca.crt";
/// The server's certificate (`--tls-cert-file`).
pub(crate) const CERT_FILE: &str = "server.crt";
/// The server's private key (`--tls-key-file`).
pub(crate) const KEY_FILE: &str = "server.key";

/// A self-signed CA and a server certificate it issued for `127.0.0.1` and
/// `localhost`, both made fresh by [`TestCa::new`]: nothing is read from or
/// committed to the repository, and no two test runs share a key.
pub struct TestCa {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    client: Arc<ClientConfig>,
}

impl fmt::Debug for TestCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// Makes a new CA and a server certificate signed by it.
    pub fn new() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        // A name of its own, so another TestCa is a stranger, not a namesake.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        ca.distinguished_name.push(
            DnType::CommonName,
            format!("redislimit throw-away test CA {nonce:x}"),
        );
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let issuer = CertifiedIssuer::self_signed(ca, ca_key).expect("self-sign the CA");

        let mut server =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("server certificate parameters");
        server
            .distinguished_name
            .push(DnType::CommonName, "redislimit test redis-server");
        let key = KeyPair::generate().expect("generate the server key");
        let cert = server
            .signed_by(&key, &issuer)
            .expect("sign the server certificate");

        let ca_pem = issuer.pem();
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(issuer.der().to_vec()))
            .expect("the CA is a valid trust anchor");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("rustls protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            ca_pem,
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            client: Arc::new(client),
        }
    }

    /// The CA certificate in PEM: what a client must trust to talk to a server using
    /// this CA's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A rustls client configuration that trusts this CA (and nothing else).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.client)
    }

    /// Writes the CA certificate, the server certificate and its key into `dir` as
    /// [`CA_FILE`], [`CERT_FILE`] and [`KEY_FILE`].
    pub(crate) fn write_to(&self, dir: &Path) -> io::Result<()> {
        fs::write(dir.join(CA_FILE), &self.ca_pem)?;
        fs::write(dir.join(CERT_FILE), &self.cert_pem)?;
        fs::write(dir.join(KEY_FILE), &self.key_pem)
    }
}
