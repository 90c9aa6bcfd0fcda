//! Embeds the browser build (`scripts/build-browser.sh` writes `target/browser-dist`, or the
//! folder `INFER_BROWSER_DIST` names) so `infer serve` offers it at `/browser/`. Without one
//! the server still builds; `/browser/` then says how to make it. Also embeds the chat page's
//! libraries (marked, DOMPurify) from `web/chat-page/node_modules` once `npm ci` has put them
//! there; without them the page shows replies as plain text and says why.
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

/// The chat page's libraries, as `/static/vendor/NAME` serves them, and where npm puts them.
const CHAT_VENDOR: &[(&str, &str)] = &[
    ("marked.js", "marked/lib/marked.umd.js"),
    ("purify.js", "dompurify/dist/purify.min.js"),
];

fn chat_vendor(manifest: &Path) {
    let modules = manifest.join("chat-page/node_modules");
    let found: Vec<_> = CHAT_VENDOR
        .iter()
        .map(|(name, rel)| (name, modules.join(rel)))
        .filter(|(_, path)| path.is_file())
        .collect();
    if found.len() == CHAT_VENDOR.len() {
        // Only the files: npm rewrites its own bookkeeping in the folder on every install.
        for (_, path) in &found {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    } else {
        // A watched path that is missing counts as changed on every build: watch the folder
        // (made empty here), which npm's install changes.
        let _ = std::fs::create_dir_all(&modules);
        println!("cargo:rerun-if-changed={}", modules.display());
    }
    let entries: Vec<_> = found
        .into_iter()
        .map(|(name, path)| (name.to_string(), path))
        .collect();
    write_assets("CHAT_VENDOR", "chat_vendor.rs", &entries);
}

/// Writes `OUT_DIR/file`: `pub static NAME: &[(&str, &[u8])]`, each entry's name with its
/// file's bytes included.
fn write_assets(name: &str, file: &str, entries: &[(String, PathBuf)]) {
    let mut code = format!("pub static {name}: &[(&str, &[u8])] = &[\n");
    for (entry, path) in entries {
        code += &format!(
            "    ({entry:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        );
    }
    code += "];\n";
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join(file);
    if let Err(e) = std::fs::write(&out, code) {
        panic!("writing {}: {e}", out.display());
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=INFER_BROWSER_DIST");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    chat_vendor(&manifest);
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
    let entries: Vec<_> = found
        .into_iter()
        .map(|f| {
            println!("cargo:rerun-if-changed={}", f.display());
            let rel = f
                .strip_prefix(&dir)
                .unwrap_or(&f)
                .to_string_lossy()
                .replace('\\', "/");
            (rel, f)
        })
        .collect();
    write_assets("BROWSER_ASSETS", "browser_assets.rs", &entries);
}
