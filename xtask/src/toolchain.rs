//! The Rust that builds the committed WASM artifacts (the kernel component in `host/assets/`
//! and the example plugins in `plugins/dist/`): their bytes depend on the compiler, so the
//! version is pinned in [`PIN_FILE`] and `build-*`/`check-*` run with it.
//!
//! The pin lives beside the kernel's WASM crate, not at the workspace root: rustup reads a
//! root `rust-toolchain.toml` for every `cargo` call, and on a machine whose one toolchain is
//! called `stable` (no network to install `1.95.0` by name) that would stop the quick start
//! itself. Here the pin is resolved to an installed toolchain *of that version*, whatever it
//! is called: the toolchain named like the pin if rustup has it, else the first installed one
//! whose `rustc --version` is the pinned version. When none is, the artifacts cannot be
//! rebuilt here and the callers exit 3 ("cannot check here"), as for a missing target.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the pin is, relative to the workspace root.
pub const PIN_FILE: &str = "kernel/wasm/rust-toolchain.toml";

/// An installed toolchain of the pinned version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// The rustup toolchain name (`1.95.0`, `stable`, …); `None` without rustup (the
    /// `rustc`/`cargo` on PATH are of the pinned version).
    pub name: Option<String>,
    /// `rustc --version` of it.
    pub version: String,
}

impl Toolchain {
    /// A command running `program` (`cargo`, `rustc`) of this toolchain.
    pub fn command(&self, program: &str) -> Command {
        match &self.name {
            Some(name) => {
                let mut c = Command::new("rustup");
                c.args(["run", name, program]);
                c
            }
            None => Command::new(program),
        }
    }

    /// This toolchain's sysroot.
    pub fn sysroot(&self) -> Option<PathBuf> {
        let out = self.command("rustc").args(["--print", "sysroot"]).output().ok()?;
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }

    /// Whether this toolchain has the standard library of `target`.
    pub fn has_target(&self, target: &str) -> bool {
        self.sysroot().is_some_and(|s| s.join("lib/rustlib").join(target).join("lib").is_dir())
    }
}

/// The `channel` of a `rust-toolchain.toml`: the one `channel = "…"` line of its
/// `[toolchain]` table (the only form this project writes).
pub fn parse_channel(text: &str) -> Result<String, String> {
    let mut table = "";
    let mut found = None;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.starts_with('[') {
            table = line;
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        if table == "[toolchain]" && key.trim() == "channel" {
            let value = value.trim();
            let channel = value.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
            match channel {
                Some(c) if !c.is_empty() && found.is_none() => found = Some(c.to_string()),
                Some(_) if found.is_some() => return Err("`channel` is given twice".into()),
                _ => return Err(format!("`channel` must be a quoted string (got {value})")),
            }
        }
    }
    found.ok_or_else(|| "no `channel = \"…\"` in its [toolchain] table".into())
}

/// Whether `rustc --version` output is of the pinned `channel` (a version such as `1.95.0`).
pub fn is_version(rustc_version: &str, channel: &str) -> bool {
    rustc_version.split_whitespace().nth(1) == Some(channel)
}

/// The pinned channel, read from [`PIN_FILE`] under `root`.
pub fn pinned(root: &Path) -> Result<String, String> {
    let path = root.join(PIN_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    parse_channel(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn version_of(toolchain: &Toolchain) -> Option<String> {
    let out = toolchain.command("rustc").arg("--version").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// An installed toolchain of the pinned version, or why there is none (naming the pin and
/// what is installed).
pub fn resolve(root: &Path) -> Result<Toolchain, String> {
    let channel = pinned(root)?;
    let rustup = Command::new("rustup").args(["toolchain", "list"]).output().ok().filter(|o| o.status.success());
    let candidates: Vec<Option<String>> = match &rustup {
        // The toolchain named like the pin first, then every installed one.
        Some(out) => std::iter::once(channel.clone())
            .chain(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .map(String::from),
            )
            .map(Some)
            .collect(),
        None => vec![None],
    };
    let mut seen = Vec::new();
    for name in candidates {
        let mut toolchain = Toolchain { name, version: String::new() };
        let Some(version) = version_of(&toolchain) else { continue };
        if is_version(&version, &channel) {
            toolchain.version = version;
            return Ok(toolchain);
        }
        seen.push(format!("{} = {version}", toolchain.name.as_deref().unwrap_or("rustc on PATH")));
    }
    Err(format!(
        "the committed WASM artifacts are built by Rust {channel} ({PIN_FILE}), and no installed toolchain is \
         that version (found: {}); install it with `rustup toolchain install {channel} --target wasm32-wasip2`",
        if seen.is_empty() { "none".to_string() } else { seen.join(", ") }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_pin_parses_and_is_a_version() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
        let channel = pinned(root).expect("the pin");
        assert_eq!(channel.split('.').count(), 3, "a full version, not a moving channel: {channel}");
        assert!(channel.split('.').all(|p| p.parse::<u32>().is_ok()), "{channel}");
    }

    #[test]
    fn parse_reads_the_toolchain_table_only() {
        let text = "# comment\n[other]\nchannel = \"nightly\"\n[toolchain]\nchannel = \"1.95.0\" # pinned\n";
        assert_eq!(parse_channel(text), Ok("1.95.0".into()));
        let error = |text: &str| parse_channel(text).err().unwrap_or_default();
        assert!(error("[toolchain]\n").contains("no `channel"));
        assert!(error("[toolchain]\nchannel = 1.95\n").contains("quoted string"));
        assert!(error("[toolchain]\nchannel = \"1\"\nchannel = \"2\"\n").contains("twice"));
    }

    #[test]
    fn versions_match_exactly() {
        assert!(is_version("rustc 1.95.0 (59807616e 2026-04-14)", "1.95.0"));
        assert!(!is_version("rustc 1.95.1 (aaaaaaaaa 2026-05-14)", "1.95.0"));
        assert!(!is_version("rustc 1.95.0-nightly (aaaaaaaaa 2026-03-01)", "1.95.0"));
        assert!(!is_version("", "1.95.0"));
    }
}
