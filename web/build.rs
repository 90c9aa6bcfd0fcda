//! Embeds the browser build (`scripts/build-browser.sh` writes `target/browser-dist`, or the
//! folder `INFER_BROWSER_DIST` names) so `infer serve` offers it at `/browser/`. Without one
//! the server still builds; `/browser/` then says how to make it.
use std::path::{Path, PathBuf};

fn files(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && depth > 0 {
            files(&p, depth - 1, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=INFER_BROWSER_DIST");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dir = std::env::var("INFER_BROWSER_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join("../target/browser-dist"));
    // Cargo counts a missing watched path as changed on every build (which rebuilt the server
    // and the binary each time): the default folder is made, empty, so it can be watched; the
    // browser build writing into it later changes its time.
    if std::env::var_os("INFER_BROWSER_DIST").is_none() {
        let _ = std::fs::create_dir_all(&dir);
    }
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut found = Vec::new();
    files(&dir, 1, &mut found);
    found.sort();
    let mut code = String::from("pub static BROWSER_ASSETS: &[(&str, &[u8])] = &[\n");
    for f in &found {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f
            .strip_prefix(&dir)
            .unwrap_or(f)
            .to_string_lossy()
            .replace('\\', "/");
        code += &format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            f.display().to_string()
        );
    }
    code += "];\n";
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("browser_assets.rs");
    if let Err(e) = std::fs::write(&out, code) {
        panic!("writing {}: {e}", out.display());
    }
}
