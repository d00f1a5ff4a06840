//! Finding workspace binaries of *other* packages from an integration test.
//!
//! Cargo only gives an integration test the binaries of its own package
//! (`CARGO_BIN_EXE_<name>`), and binary dependencies are not stable. So [`rdmx_bin`] asks
//! Cargo itself: it runs `cargo build -p rdmx-tools --bin rdmx` with the profile, target
//! triple and target directory of the running test executable and
//! `--message-format=json`, and takes the executable path from Cargo's `compiler-artifact`
//! message. When the binary is up to date (always the case under `cargo test --workspace`,
//! which builds it before running any test) this takes a fraction of a second; otherwise it
//! builds it first, so `cargo test -p rdmx-tests` never runs a stale `rdmx`.
//!
//! Set `RDMX_BIN=/path/to/rdmx` to skip Cargo and use that binary.
//!
//! Where the test executable is `<target>/[<triple>/]<profile-dir>/deps/<test>-<hash>`, the
//! profile is `dev` for the `debug` directory and the directory name otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::json::Json;
use crate::process;

/// Limit for the `cargo build` (a cold build of the tools on a small machine).
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The environment variable that names an `rdmx` binary to use as is.
pub const RDMX_BIN_ENV: &str = "RDMX_BIN";

/// The `rdmx` command (package `rdmx-tools`), built if needed; the result is computed once
/// per process.
///
/// # Errors
/// Why it could not be found or built (with Cargo's diagnostics).
pub fn rdmx_bin() -> Result<PathBuf, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os(RDMX_BIN_ENV) {
            let p = PathBuf::from(p);
            return if p.is_file() {
                Ok(p)
            } else {
                Err(format!("{RDMX_BIN_ENV}={} is not a file", p.display()))
            };
        }
        cargo_build_bin("rdmx-tools", "rdmx")
    })
    .clone()
}

/// Where the running test executable was built.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BuildLayout {
    target_dir: PathBuf,
    triple: Option<String>,
    profile: String,
    /// `<target>/[<triple>/]<profile-dir>`: where Cargo puts binaries.
    profile_dir: PathBuf,
}

/// Derives the layout from the test executable's path (`.../<profile-dir>/deps/<exe>`);
/// `is_target_dir` tells whether a directory is a Cargo target directory.
fn layout_of(exe: &Path, is_target_dir: impl Fn(&Path) -> bool) -> Option<BuildLayout> {
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    let profile_dir = deps.parent()?;
    let dir_name = profile_dir.file_name()?.to_str()?;
    let above = profile_dir.parent()?;
    let (target_dir, triple) = if is_target_dir(above) {
        (above.to_path_buf(), None)
    } else {
        let t = above.parent()?;
        (
            t.to_path_buf(),
            Some(above.file_name()?.to_str()?.to_string()),
        )
    };
    let profile = if dir_name == "debug" {
        "dev".to_string()
    } else {
        dir_name.to_string()
    };
    Some(BuildLayout {
        target_dir,
        triple,
        profile,
        profile_dir: profile_dir.to_path_buf(),
    })
}

/// Builds binary `bin` of workspace package `package` like the running test was built, and
/// returns its path.
///
/// # Errors
/// When the layout is unknown, Cargo cannot be run, or the build fails.
pub fn cargo_build_bin(package: &str, bin: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let layout = layout_of(&exe, |d| d.join("CACHEDIR.TAG").is_file()).ok_or_else(|| {
        format!(
            "cannot tell the Cargo target directory from the test executable {}; \
             set {RDMX_BIN_ENV}",
            exe.display()
        )
    })?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|ws| ws.join("Cargo.toml"))
        .ok_or("no workspace directory")?;
    let mut c = Command::new(&cargo);
    c.args([
        "build",
        "--message-format=json-render-diagnostics",
        "-p",
        package,
    ])
    .args(["--bin", bin, "--profile", &layout.profile])
    .arg("--manifest-path")
    .arg(&manifest)
    .arg("--target-dir")
    .arg(&layout.target_dir);
    if let Some(t) = &layout.triple {
        c.args(["--target", t]);
    }
    let desc = process::describe(&c);
    let fallback = layout.profile_dir.join(bin);
    let out = match process::run(c, BUILD_TIMEOUT) {
        Ok(o) => o,
        // No Cargo at all (e.g. the test binary was copied elsewhere): use what is there.
        Err(_) if fallback.is_file() => return Ok(fallback),
        Err(e) => return Err(e.to_string()),
    };
    if !out.status.success() {
        return Err(format!(
            "`{desc}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|l| Json::parse(l).ok())
        .filter(|m| m.get("reason").and_then(Json::as_str) == Some("compiler-artifact"))
        .filter(|m| m.path(&["target", "name"]).and_then(Json::as_str) == Some(bin))
        .find_map(|m| {
            m.get("executable")
                .and_then(Json::as_str)
                .map(PathBuf::from)
        })
        .ok_or_else(|| format!("`{desc}` reported no executable named {bin}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_from_the_test_executable_path() {
        let t = |d: &Path| d.ends_with("target");
        let l = layout_of(Path::new("/w/target/debug/deps/netns_rc-abc"), t).unwrap();
        assert_eq!(l.target_dir, Path::new("/w/target"));
        assert_eq!(l.triple, None);
        assert_eq!(l.profile, "dev");
        assert_eq!(l.profile_dir, Path::new("/w/target/debug"));
        let l = layout_of(
            Path::new("/w/target/x86_64-unknown-linux-gnu/release/deps/x-1"),
            t,
        )
        .unwrap();
        assert_eq!(l.target_dir, Path::new("/w/target"));
        assert_eq!(l.triple.as_deref(), Some("x86_64-unknown-linux-gnu"));
        assert_eq!(l.profile, "release");
        assert!(layout_of(Path::new("/usr/bin/x"), t).is_none());
    }
}
