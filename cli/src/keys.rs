//! `stowplan keys`: a ZeroMQ CURVE key pair for the packer, an orchestrator or a rank.

#[cfg(feature = "zmq")]
use std::fmt;
use std::path::PathBuf;

#[cfg(feature = "zmq")]
use serde::Serialize;
#[cfg(feature = "zmq")]
use stowplan_zmq::{Certificate, curve};

#[cfg(feature = "zmq")]
use crate::common::print_report;
use crate::failure::Failure;

/// The options of `stowplan keys`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory the certificates are written to (created if missing).
    dir: PathBuf,
    /// Name of the key pair: writes DIR/NAME.key (public: give it to the peers) and
    /// DIR/NAME.key_secret (mode 0600: keep it). Existing files are never overwritten.
    name: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// What `stowplan keys` wrote.
#[cfg(feature = "zmq")]
#[derive(Debug, Serialize)]
struct Report {
    /// The public certificate.
    public_certificate: PathBuf,
    /// The secret certificate.
    secret_certificate: PathBuf,
    /// The public key (Z85).
    public_key: String,
}

#[cfg(feature = "zmq")]
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "public key {}", self.public_key)?;
        writeln!(
            f,
            "  {}  (public: the packer's goes to every client; a client's into --zmq-curve-clients)",
            self.public_certificate.display()
        )?;
        writeln!(f, "  {}  (secret, mode 0600: keep it where it is used)", self.secret_certificate.display())
    }
}

/// Runs `stowplan keys`.
#[cfg(feature = "zmq")]
pub fn run(a: Args) -> Result<(), Failure> {
    let cert = Certificate::generate()?;
    let (public, secret) = cert.save(&a.dir, &a.name)?;
    let secret = secret.expect("a generated certificate has a secret key");
    print_report(
        &Report { public_certificate: public, secret_certificate: secret, public_key: curve::z85(&cert.public) },
        a.json,
    )
}

/// `stowplan keys` in a build without the ZeroMQ transport: says how to get one.
#[cfg(not(feature = "zmq"))]
pub fn run(_: Args) -> Result<(), Failure> {
    Err(crate::failure::without_zmq("stowplan keys"))
}
