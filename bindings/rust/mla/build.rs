//! Adds libmla's directory (found by mla-sys, published as DEP_MLA_LIB_DIR)
//! as an rpath of this crate's tests and examples, so they run without
//! LD_LIBRARY_PATH. Link arguments of a dependency's build script do not
//! reach dependent crates, hence this second script.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLA_LIB_DIR");
    if let Some(dirs) = std::env::var_os("DEP_MLA_LIB_DIR") {
        for dir in std::env::split_paths(&dirs) {
            if !dir.as_os_str().is_empty() {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            }
        }
    }
}
