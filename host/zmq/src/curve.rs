//! CURVE authentication and encryption for the ZeroMQ transport.
//!
//! With CURVE every connection to the packer is encrypted, and a peer gets through only with
//! a key pair whose public key the packer accepts: the packer has a key pair of its own
//! ([`CurveServer`]: its secret certificate and a directory of the public certificates of
//! the orchestrators and ranks it admits); each orchestrator and rank has a key pair and the
//! packer's public key ([`CurveClient`]). A ZAP handler inside the packer admits a client
//! key only if a public certificate in that directory names it; a refused key is logged and
//! its connection never carries a message.
//!
//! Keys are ZeroMQ certificates: the text format that pyzmq's `zmq.auth.create_certificates`
//! and czmq write (`NAME.key` holds the public key, `NAME.key_secret` both; keys in Z85).
//! `stowplan keys DIR NAME` writes a pair ([`Certificate::generate`], [`Certificate::save`]).
//! A secret certificate must be readable by its owner only (mode 0600), like an ssh key.
//!
//! libzmq has CURVE only when built with libsodium. The `zmq` crate's own build of libzmq
//! has no libsodium, so CURVE needs the system's libzmq: `apt install libzmq3-dev`, then build
//! with `--config .cargo/system-libzmq.toml` (README, "CURVE"). [`curve_available`] tells;
//! without it every CURVE call is refused with that advice, never ignored.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use stowplan::Error;
use stowplan::serve::protocol::{curve_timeout_hint, secret_certificate_mode_error};

use crate::support::{Throttled, zmq_error};

/// A CURVE key (public or secret): 32 bytes.
pub type CurveKey = [u8; 32];

/// Whether this build's libzmq has CURVE (see the module docs).
pub fn curve_available() -> bool {
    zmq::has("curve") == Some(true)
}

/// `Ok` when CURVE is available, else the error that says how to get it.
pub fn require_curve() -> Result<(), Error> {
    if curve_available() {
        return Ok(());
    }
    Err(Error::InvalidArgument(
        "CURVE: this build's libzmq has no CURVE (the zmq crate builds libzmq without libsodium); \
         install the system libzmq (apt install libzmq3-dev) and build with \
         `--config .cargo/system-libzmq.toml` (README, \"CURVE\")"
            .into(),
    ))
}

/// The Z85 text of a key (40 characters).
pub fn z85(key: &CurveKey) -> String {
    zmq::z85_encode(key).expect("32 bytes are a multiple of 4")
}

/// A ZeroMQ certificate: a public key, and the secret key for a secret certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate {
    /// The public key.
    pub public: CurveKey,
    /// The secret key (`None` in a public certificate).
    pub secret: Option<CurveKey>,
}

impl std::fmt::Debug for Certificate {
    /// Shows the public key; never the secret one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("public", &z85(&self.public))
            .field("secret", &self.secret.map(|_| "…"))
            .finish()
    }
}

/// The largest certificate file read (they are a few hundred bytes).
const MAX_CERTIFICATE_BYTES: u64 = 64 * 1024;

impl Certificate {
    /// A new key pair. Errors: `invalid-argument` without CURVE ([`require_curve`]).
    pub fn generate() -> Result<Self, Error> {
        require_curve()?;
        let pair = zmq::CurveKeyPair::new().map_err(|e| zmq_error("generating a key pair", e))?;
        Ok(Self { public: pair.public_key, secret: Some(pair.secret_key) })
    }

    /// Reads a certificate file: its `public-key = "…"` line and, in a secret certificate,
    /// its `secret-key = "…"` line. A file with a secret key must be readable by its owner
    /// only.
    ///
    /// Errors: `io` when the file cannot be read; `invalid-argument` naming the file (and the
    /// line) for a missing or malformed key or a key that is not 32 bytes, and for a secret
    /// certificate others can read ("chmod 600 FILE"). Whether the two keys of a secret
    /// certificate belong together is not checked here: a wrong pair fails the handshake.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let bad = |what: String| Error::InvalidArgument(format!("certificate {}: {what}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| Error::io("reading the certificate", path, e))?;
        if meta.len() > MAX_CERTIFICATE_BYTES {
            return Err(bad(format!("{} bytes: not a certificate (at most {MAX_CERTIFICATE_BYTES})", meta.len())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading the certificate", path, e))?;
        let (mut public, mut secret) = (None, None);
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let Some((name, value)) = line.split_once('=') else { continue };
            let slot = match name.trim() {
                "public-key" => &mut public,
                "secret-key" => &mut secret,
                _ => continue,
            };
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
            let key = zmq::z85_decode(value)
                .ok()
                .and_then(|k| CurveKey::try_from(k).ok())
                .ok_or_else(|| bad(format!("line {}: {} is not a Z85 key of 40 characters", n + 1, name.trim())))?;
            *slot = Some(key);
        }
        let public = public.ok_or_else(|| bad("no public-key line".into()))?;
        if secret.is_some() {
            use std::os::unix::fs::PermissionsExt;
            let shown = path.display().to_string();
            if let Some(m) = secret_certificate_mode_error(&shown, meta.permissions().mode()) {
                return Err(Error::InvalidArgument(m));
            }
        }
        Ok(Self { public, secret })
    }

    /// Like [`Certificate::load`], and the file must hold a secret key.
    pub fn load_secret(path: &Path) -> Result<(CurveKey, CurveKey), Error> {
        let c = Self::load(path)?;
        let secret = c.secret.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "certificate {}: no secret-key line (this is a public certificate; give NAME.key_secret)",
                path.display()
            ))
        })?;
        Ok((c.public, secret))
    }

    /// Writes `DIR/NAME.key` (the public certificate) and, for a key pair, `DIR/NAME.key_secret`
    /// (mode 0600), atomically; returns their paths (public first). An existing file is never
    /// overwritten.
    ///
    /// Errors: `invalid-argument` for a name that is empty or has a path separator, or a file
    /// that exists; `io` when writing fails.
    pub fn save(&self, dir: &Path, name: &str) -> Result<(PathBuf, Option<PathBuf>), Error> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(Error::InvalidArgument(format!(
                "name must be a file name without '/' and not starting with '.' (got {name:?})"
            )));
        }
        let public_path = dir.join(format!("{name}.key"));
        let secret_path = dir.join(format!("{name}.key_secret"));
        let exists = |p: &Path| Error::InvalidArgument(format!("{} exists: not overwriting a key", p.display()));
        if secret_path.exists() {
            return Err(exists(&secret_path));
        }
        let header = "#   ZeroMQ CURVE certificate written by stowplan\n";
        let public_line = format!("    public-key = \"{}\"\n", z85(&self.public));
        let public = format!("{header}#   Public: give it to the peers\n\nmetadata\ncurve\n{public_line}");
        // Each file appears whole or not at all, and an existing one is never replaced.
        if !stowplan::runtime::create_atomic(&public_path, public.as_bytes(), 0o644)? {
            return Err(exists(&public_path));
        }
        let Some(secret) = &self.secret else { return Ok((public_path, None)) };
        let text = format!(
            "{header}#   SECRET: do not give this file to anyone nor change its permissions\n\nmetadata\ncurve\n{public_line}    secret-key = \"{}\"\n",
            z85(secret)
        );
        if !stowplan::runtime::create_atomic(&secret_path, text.as_bytes(), 0o600)? {
            return Err(exists(&secret_path));
        }
        Ok((public_path, Some(secret_path)))
    }
}

/// The packer's side of CURVE: its key pair and the client keys it admits.
#[derive(Clone)]
pub struct CurveServer {
    /// The packer's public key (clients need it: its `NAME.key`).
    pub public: CurveKey,
    secret: CurveKey,
    /// The public keys of the orchestrators and ranks admitted.
    pub clients: Vec<CurveKey>,
}

impl std::fmt::Debug for CurveServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurveServer")
            .field("public", &z85(&self.public))
            .field("clients", &self.clients.iter().map(z85).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// At most this many client certificates are read from the clients directory.
pub const MAX_CLIENT_KEYS: usize = 65_536;

impl CurveServer {
    /// The packer's secret certificate `secret` and the public certificates (`*.key`) in
    /// directory `clients`.
    ///
    /// Errors: those of [`Certificate::load`], naming the file; `invalid-argument` when
    /// `clients` holds no `*.key` file (nobody could connect) or more than
    /// [`MAX_CLIENT_KEYS`]; `io` when the directory cannot be read.
    pub fn load(secret: &Path, clients: &Path) -> Result<Self, Error> {
        let (public, secret) = Certificate::load_secret(secret)?;
        let mut keys = Vec::new();
        let entries =
            std::fs::read_dir(clients).map_err(|e| Error::io("reading the client keys directory", clients, e))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "key"))
            .collect();
        paths.sort();
        if paths.len() > MAX_CLIENT_KEYS {
            return Err(Error::InvalidArgument(format!(
                "{}: {} client certificates (at most {MAX_CLIENT_KEYS})",
                clients.display(),
                paths.len()
            )));
        }
        for p in &paths {
            keys.push(Certificate::load(p)?.public);
        }
        if keys.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{}: no client certificate (NAME.key) in the directory: no orchestrator or rank could connect",
                clients.display()
            )));
        }
        Ok(Self { public, secret, clients: keys })
    }

    /// Makes `socket` a CURVE server with this key pair (before it binds) that admits no
    /// client without the ZAP handler's yes: were the handler gone, libzmq would otherwise
    /// admit every client that knows the packer's public key ("legacy" mode).
    pub(crate) fn apply(&self, socket: &mut zmq::Socket, what: &str) -> Result<(), Error> {
        require_curve()?;
        socket.set_curve_server(true).map_err(|e| zmq_error(what, e))?;
        socket.set_curve_secretkey(&self.secret).map_err(|e| zmq_error(what, e))?;
        socket.set_zap_domain("stowplan").map_err(|e| zmq_error(what, e))?;
        enforce_zap(socket).map_err(|e| zmq_error(&format!("{what}: requiring the ZAP handler"), e))
    }
}

/// An orchestrator's or rank's side of CURVE: its key pair and the packer's public key.
#[derive(Clone)]
pub struct CurveClient {
    /// The packer's public key.
    pub server: CurveKey,
    /// This client's public key (the packer's clients directory must hold it).
    pub public: CurveKey,
    secret: CurveKey,
}

impl std::fmt::Debug for CurveClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurveClient")
            .field("server", &z85(&self.server))
            .field("public", &z85(&self.public))
            .finish_non_exhaustive()
    }
}

impl CurveClient {
    /// The packer's public certificate `server` and this client's secret certificate `own`.
    /// Errors: those of [`Certificate::load`], naming the file.
    pub fn load(server: &Path, own: &Path) -> Result<Self, Error> {
        let server = Certificate::load(server)?.public;
        let (public, secret) = Certificate::load_secret(own)?;
        Ok(Self { server, public, secret })
    }

    /// Makes `socket` a CURVE client of the packer (before it connects).
    pub(crate) fn apply(&self, socket: &zmq::Socket, what: &str) -> Result<(), Error> {
        require_curve()?;
        socket.set_curve_serverkey(&self.server).map_err(|e| zmq_error(what, e))?;
        socket.set_curve_publickey(&self.public).map_err(|e| zmq_error(what, e))?;
        socket.set_curve_secretkey(&self.secret).map_err(|e| zmq_error(what, e))?;
        Ok(())
    }

    /// What a client that hears nothing from the packer should check (added to its timeout
    /// error).
    pub fn timeout_hint(&self) -> String {
        curve_timeout_hint(&z85(&self.public), &z85(&self.server))
    }
}

/// libzmq's `ZMQ_ZAP_ENFORCE_DOMAIN` (a "draft" name the zmq crate has no setter for; every
/// libzmq ≥ 4.2.3 takes it): with it, a CURVE handshake fails when no ZAP handler answers.
const ZMQ_ZAP_ENFORCE_DOMAIN: std::os::raw::c_int = 93;

/// Sets [`ZMQ_ZAP_ENFORCE_DOMAIN`] on `socket`.
fn enforce_zap(socket: &mut zmq::Socket) -> Result<(), zmq::Error> {
    let on: std::os::raw::c_int = 1;
    // SAFETY: `socket` is open for the duration of the call, and the option takes an int,
    // given by a pointer to one and its size.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            socket.as_mut_ptr(),
            ZMQ_ZAP_ENFORCE_DOMAIN,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<std::os::raw::c_int>(),
        )
    };
    // SAFETY: zmq_errno reads this thread's last libzmq error.
    if rc == 0 { Ok(()) } else { Err(zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })) }
}

/// Where libzmq asks a ZAP handler whether to admit a peer (RFC 27).
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// How often refused client keys are logged at most (each is counted).
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The packer's ZAP handler: a thread admitting CURVE clients whose key is in the list.
/// Stopped and joined on drop (before the context it belongs to closes).
pub(crate) struct ZapHandler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ZapHandler {
    /// Binds the handler in `context` (before any CURVE server socket binds) and starts it.
    pub(crate) fn start(context: &zmq::Context, clients: Vec<CurveKey>) -> Result<Self, Error> {
        let socket = context.socket(zmq::REP).map_err(|e| zmq_error("the ZAP handler", e))?;
        socket.set_linger(0).map_err(|e| zmq_error("the ZAP handler", e))?;
        socket.bind(ZAP_ENDPOINT).map_err(|e| zmq_error("binding the ZAP handler", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("stowplan-zap".into())
            .spawn(move || serve_zap(&socket, &clients, &flag))
            .map_err(|e| Error::Io(format!("starting the ZAP handler thread: {e}")))?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl ZapHandler {
    /// `Ok` while the handler runs; an error once its thread ended (it never should: a
    /// handshake then fails rather than admitting anyone, and the packer stops).
    pub(crate) fn check(&self) -> Result<(), Error> {
        match &self.thread {
            Some(t) if !t.is_finished() => Ok(()),
            _ => Err(Error::Io("CURVE: the ZAP handler thread ended: no client can be admitted".into())),
        }
    }
}

impl Drop for ZapHandler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The ZAP handler's loop: one request, one reply, until `stop` (or the context closes). It
/// never gives up on an error: a handler that stopped answering would make every CURVE
/// handshake fail (sockets enforce it), so a failed receive or send is logged and retried.
fn serve_zap(socket: &zmq::Socket, clients: &[CurveKey], stop: &AtomicBool) {
    let mut refused = Throttled::new(REFUSED_LOG_EVERY);
    let failed = |what: &str, e: zmq::Error| {
        tracing::error!(target: "stowplan::serve", error = %e, "the CURVE gatekeeper (ZAP handler) could not {what}; retrying");
        std::thread::sleep(Duration::from_millis(10));
    };
    while !stop.load(Ordering::SeqCst) {
        match socket.poll(zmq::POLLIN, 100) {
            Ok(0) | Err(zmq::Error::EINTR) => continue,
            Ok(_) => {}
            Err(zmq::Error::ETERM) => return,
            Err(e) => {
                failed("wait for a request", e);
                continue;
            }
        }
        let request = match socket.recv_multipart(0) {
            Ok(r) => r,
            Err(zmq::Error::ETERM) => return,
            Err(zmq::Error::EINTR) => continue,
            Err(e) => {
                failed("receive a request", e);
                continue;
            }
        };
        let reply = zap_reply(&request, clients);
        if reply[2] != b"200"
            && let Some(since) = refused.note()
        {
            let key = request.get(6).and_then(|k| CurveKey::try_from(k.as_slice()).ok()).map(|k| z85(&k));
            let address = request.get(3).map(|a| String::from_utf8_lossy(a).into_owned());
            tracing::warn!(target: "stowplan::serve", key = ?key, address = ?address, refused = since, total = refused.total(),
                "refused a CURVE client whose public key is not in the clients directory");
        }
        loop {
            match socket.send_multipart(reply.clone(), 0) {
                Ok(()) => break,
                Err(zmq::Error::ETERM) => return,
                Err(zmq::Error::EINTR) => continue,
                Err(e) => {
                    // A REP socket that cannot answer cannot take the next request either.
                    failed("answer a request", e);
                    break;
                }
            }
        }
    }
}

/// The reply to one ZAP request: `200` for a CURVE client whose key is in `clients`, `400`
/// for anything else (another mechanism, a malformed request, an unknown key).
fn zap_reply(request: &[Vec<u8>], clients: &[CurveKey]) -> [Vec<u8>; 6] {
    let id = request.get(1).cloned().unwrap_or_default();
    let admitted = request.len() >= 7
        && request[0] == b"1.0"
        && request[5] == b"CURVE"
        && clients.iter().any(|k| k[..] == request[6][..]);
    let (status, text, user) = if admitted {
        (&b"200"[..], &b"OK"[..], z85(&CurveKey::try_from(&request[6][..]).expect("checked")).into_bytes())
    } else {
        (&b"400"[..], &b"client key not admitted"[..], Vec::new())
    };
    [b"1.0".to_vec(), id, status.to_vec(), text.to_vec(), user, Vec::new()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option that makes CURVE fail closed exists in every build (the vendored libzmq
    /// too); with CURVE, a server whose ZAP handler is missing admits nobody — not even a
    /// client that knows its public key (libzmq's default would admit every such client).
    #[test]
    fn a_curve_server_without_its_zap_handler_admits_nobody() {
        let context = zmq::Context::new();
        let mut plain = context.socket(zmq::PULL).unwrap();
        enforce_zap(&mut plain).expect("ZMQ_ZAP_ENFORCE_DOMAIN is known to this libzmq");
        if !curve_available() {
            assert!(std::env::var("STOWPLAN_EXPECT_CURVE").as_deref() != Ok("1"), "a CURVE build without CURVE");
            return;
        }
        let server = Certificate::generate().unwrap();
        let keys = CurveServer { public: server.public, secret: server.secret.unwrap(), clients: vec![] };
        let mut pull = context.socket(zmq::PULL).unwrap();
        keys.apply(&mut pull, "test").unwrap();
        pull.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = pull.get_last_endpoint().unwrap().unwrap();
        let client_keys = Certificate::generate().unwrap();
        let client =
            CurveClient { server: server.public, public: client_keys.public, secret: client_keys.secret.unwrap() };
        let push = context.socket(zmq::PUSH).unwrap();
        push.set_linger(0).unwrap();
        client.apply(&push, "test").unwrap();
        push.connect(&endpoint).unwrap();
        push.send(&b"let me in"[..], zmq::DONTWAIT).ok();
        assert_eq!(pull.poll(zmq::POLLIN, 1500).unwrap(), 0, "a message got through without a ZAP handler");
    }

    #[test]
    fn zap_admits_only_listed_curve_keys() {
        let known = [7u8; 32];
        let req = |mech: &[u8], key: &[u8]| -> Vec<Vec<u8>> {
            vec![
                b"1.0".to_vec(),
                b"id9".to_vec(),
                b"stowplan".into(),
                b"10.0.0.5".into(),
                vec![],
                mech.to_vec(),
                key.to_vec(),
            ]
        };
        let ok = zap_reply(&req(b"CURVE", &known), &[known]);
        assert_eq!((&ok[1][..], &ok[2][..]), (&b"id9"[..], &b"200"[..]));
        assert_eq!(zap_reply(&req(b"CURVE", &[8u8; 32]), &[known])[2], b"400");
        assert_eq!(zap_reply(&req(b"NULL", &known), &[known])[2], b"400");
        assert_eq!(zap_reply(&req(b"CURVE", &known)[..6], &[known])[2], b"400", "a short request");
        assert_eq!(zap_reply(&[], &[known])[2], b"400");
    }
}
