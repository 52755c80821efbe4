//! `RedisTls`: which certificate authorities a `rediss://` connection trusts.

use std::fmt;
use std::path::Path;

use deadpool_redis::redis::TlsCertificates;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::ConfigError;

/// The certificate authorities that connections to Redis over TLS trust,
/// for the `RedisPool::*_tls` constructors (feature `tls-rustls`).
///
/// Without it, a `rediss://` URL trusts the system's certificate store
/// (read by `rustls-native-certs`, which reads `SSL_CERT_FILE` and
/// `SSL_CERT_DIR` instead when they are set). With it, only the given CA
/// certificates are trusted: the way to reach a Redis whose certificate was
/// issued by your own CA.
///
/// ```no_run
/// use redislimit::{RedisPool, RedisTimeouts, RedisTls};
///
/// let tls = RedisTls::ca_file("/etc/redis/tls/ca.crt")?;
/// let pool = RedisPool::standalone_tls("rediss://redis.internal:6380/", &tls, RedisTimeouts::default())?;
/// # Ok::<(), redislimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisTls {
    certificates: TlsCertificates,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls").finish_non_exhaustive()
    }
}

impl RedisTls {
    /// Trusts the CA certificates in `pem` (one or more `BEGIN CERTIFICATE`
    /// blocks) and nothing else.
    ///
    /// Fails with [`ConfigError::InvalidRedis`] when `pem` holds no
    /// certificate or one that does not parse.
    pub fn ca_pem(pem: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let pem = pem.into();
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| invalid_ca(format!("a CA certificate does not parse: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| invalid_ca(format!("a CA certificate does not parse: {e}")))?;
        }
        if roots.is_empty() {
            return Err(invalid_ca("no PEM certificate found".to_owned()));
        }
        Ok(Self {
            certificates: TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            },
        })
    }

    /// Like [`RedisTls::ca_pem`], with the PEM read from the file at `path`.
    pub fn ca_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let pem = std::fs::read(path)
            .map_err(|e| invalid_ca(format!("cannot read {}: {e}", path.display())))?;
        Self::ca_pem(pem).map_err(|e| match e {
            ConfigError::InvalidRedis { reason } => ConfigError::InvalidRedis {
                reason: format!("{reason} in {}", path.display()),
            },
            other => other,
        })
    }

    pub(crate) fn certificates(&self) -> TlsCertificates {
        self.certificates.clone()
    }
}

fn invalid_ca(reason: String) -> ConfigError {
    ConfigError::InvalidRedis {
        reason: format!("Redis TLS CA: {reason}"),
    }
}

/// Makes sure rustls has a process-wide crypto provider before a TLS
/// connection is configured: the one the application installed, or else
/// ring's. Without one, rustls panics when both of its providers are
/// compiled in (another crate of the application may enable aws-lc-rs).
pub(crate) fn ensure_crypto_provider() {
    if CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: any provider will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::RedisTls;
    use crate::ConfigError;

    #[test]
    fn a_ca_without_certificates_is_refused() {
        for pem in [&b""[..], b"not a certificate"] {
            let err = RedisTls::ca_pem(pem).unwrap_err();
            assert!(
                matches!(&err, ConfigError::InvalidRedis { reason } if reason.contains("no PEM certificate")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_broken_certificate_is_refused() {
        for body in ["!!!!", "AAAA"] {
            let pem = format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n");
            let err = RedisTls::ca_pem(pem).unwrap_err();
            assert!(err.to_string().contains("does not parse"), "{body}: {err}");
        }
    }

    #[test]
    fn a_missing_ca_file_is_a_config_error() {
        let err = RedisTls::ca_file("/nonexistent/redislimit-ca.pem").unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }
}
