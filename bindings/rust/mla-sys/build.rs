//! Finds libmla and tells cargo how to link it.
//!
//! Order: `MLA_LIB_DIR`, then `MLA_NO_PKG_CONFIG`, then the `pkg-config`
//! command (package `mla`, then `mla-uninstalled`, then meson build
//! directories named in `PKG_CONFIG_PATH`). See the crate documentation.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

const ENV_VARS: &[&str] = &[
    "MLA_LIB_DIR",
    "MLA_NO_PKG_CONFIG",
    "PKG_CONFIG",
    "PKG_CONFIG_PATH",
    "PKG_CONFIG_LIBDIR",
    "PKG_CONFIG_SYSROOT_DIR",
    "PKG_CONFIG_DISABLE_UNINSTALLED",
    "PKG_CONFIG_ALLOW_SYSTEM_LIBS",
];

/// What the linker needs: search directories and libraries.
#[derive(Default)]
struct Link {
    dirs: Vec<PathBuf>,
    libs: Vec<String>,
    include_dirs: Vec<PathBuf>,
    how: String,
}

fn env_set(name: &str) -> bool {
    env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

fn pkg_config_cmd() -> OsString {
    env::var_os("PKG_CONFIG")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "pkg-config".into())
}

/// Runs `pkg-config <args> <package>`, optionally with PKG_CONFIG_PATH
/// replaced; returns stdout on success.
fn run_pkg_config(args: &[&str], package: &str, path: Option<&OsString>) -> Result<String, String> {
    let mut cmd = Command::new(pkg_config_cmd());
    cmd.args(args).arg(package);
    if let Some(p) = path {
        cmd.env("PKG_CONFIG_PATH", p);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {:?}: {}", pkg_config_cmd(), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn parse_libs(text: &str, link: &mut Link) {
    for tok in text.split_whitespace() {
        if let Some(d) = tok.strip_prefix("-L") {
            if !d.is_empty() {
                link.dirs.push(PathBuf::from(d));
            }
        } else if let Some(l) = tok.strip_prefix("-l") {
            if !l.is_empty() && !link.libs.iter().any(|x| x == l) {
                link.libs.push(l.to_string());
            }
        }
    }
}

fn parse_includes(text: &str, link: &mut Link) {
    for tok in text.split_whitespace() {
        if let Some(d) = tok.strip_prefix("-I") {
            if !d.is_empty() {
                link.include_dirs.push(PathBuf::from(d));
            }
        }
    }
}

fn try_package(package: &str, path: Option<&OsString>, errors: &mut Vec<String>) -> Option<Link> {
    match run_pkg_config(&["--libs-only-L", "--libs-only-l"], package, path) {
        Ok(libs) => {
            let mut link = Link::default();
            parse_libs(&libs, &mut link);
            if let Ok(cflags) = run_pkg_config(&["--cflags-only-I"], package, path) {
                parse_includes(&cflags, &mut link);
            }
            link.how = match path {
                Some(p) => format!("pkg-config {} (PKG_CONFIG_PATH={})", package, p.to_string_lossy()),
                None => format!("pkg-config {}", package),
            };
            Some(link)
        }
        Err(e) => {
            errors.push(format!("pkg-config {}: {}", package, e));
            None
        }
    }
}

fn find_with_pkg_config() -> Result<Link, String> {
    let mut errors = Vec::new();
    // 1. As given: an installed mla.pc, or any PKG_CONFIG_PATH entry (pkg-config
    //    itself prefers mla-uninstalled.pc when one is on the path).
    if let Some(l) = try_package("mla", None, &mut errors) {
        return Ok(l);
    }
    // 2. Meson's uninstalled file by name (PKG_CONFIG_DISABLE_UNINSTALLED may
    //    hide it from step 1).
    if let Some(l) = try_package("mla-uninstalled", None, &mut errors) {
        return Ok(l);
    }
    // 3. PKG_CONFIG_PATH entries that are meson build directories.
    if let Some(given) = env::var_os("PKG_CONFIG_PATH") {
        for dir in env::split_paths(&given) {
            let sub = dir.join("meson-uninstalled");
            if sub.join("mla-uninstalled.pc").is_file() {
                let mut paths = vec![sub];
                paths.extend(env::split_paths(&given));
                let joined = env::join_paths(paths).map_err(|e| e.to_string())?;
                if let Some(l) = try_package("mla-uninstalled", Some(&joined), &mut errors) {
                    return Ok(l);
                }
            }
        }
    }
    Err(errors.join("\n  "))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for v in ENV_VARS {
        println!("cargo:rerun-if-env-changed={}", v);
    }

    let link = if let Some(dir) = env::var_os("MLA_LIB_DIR").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        if !dir.join("libmla.so").exists() && !dir.join("libmla.so.0").exists() && !dir.join("libmla.a").exists() {
            println!(
                "cargo:warning=MLA_LIB_DIR={} does not contain libmla.so; linking may fail",
                dir.display()
            );
        }
        Link {
            dirs: vec![dir],
            libs: vec!["mla".into()],
            include_dirs: Vec::new(),
            how: "MLA_LIB_DIR".into(),
        }
    } else if env_set("MLA_NO_PKG_CONFIG") {
        Link {
            dirs: Vec::new(),
            libs: vec!["mla".into()],
            include_dirs: Vec::new(),
            how: "MLA_NO_PKG_CONFIG".into(),
        }
    } else {
        match find_with_pkg_config() {
            Ok(l) => l,
            Err(e) => panic!(
                "\n\nmla-sys: could not find libmla.\n  {}\n\n\
                 Build libmla first (cd <libmla> && meson setup build && ninja -C build), then either\n  \
                 PKG_CONFIG_PATH=<libmla>/build/meson-uninstalled cargo build   (uninstalled build tree),\n  \
                 install it (meson install -C build) so that `pkg-config --libs mla` works, or\n  \
                 MLA_LIB_DIR=<dir containing libmla.so> cargo build.\n\n",
                e
            ),
        }
    };

    let mut libs = link.libs.clone();
    if !libs.iter().any(|l| l == "mla") {
        libs.insert(0, "mla".into());
    }
    for dir in &link.dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
        // rpath for this crate's own tests and examples; dependents read
        // DEP_MLA_LIB_DIR and add it themselves (link args do not propagate).
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    for lib in &libs {
        println!("cargo:rustc-link-lib=dylib={}", lib);
    }
    let dirs: Vec<&Path> = link.dirs.iter().map(|d| d.as_path()).collect();
    if let Ok(joined) = env::join_paths(&dirs) {
        println!("cargo:lib_dir={}", joined.to_string_lossy());
    }
    if let Ok(joined) = env::join_paths(&link.include_dirs) {
        println!("cargo:include={}", joined.to_string_lossy());
    }
    println!("cargo:how={}", link.how);
}
