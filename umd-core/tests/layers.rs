//! The layers of umd-core (`docs/architecture.md`, "Layers"): a module
//! imports only from the modules below it, never from one above. The
//! test reads every file under `src/`, drops comments, strings and
//! character literals (doc links may point anywhere), and resolves every
//! `crate::`, `$crate::` and `super::` path in the code (in `use` lists
//! with braces, nested or not, and full paths in expressions, types and
//! `pub(in …)` alike) to the top-level module it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, lowest first. Within a layer a module may import the
/// modules listed before it, not those after it; any module may import
/// every module of the layers below its own.
const LAYERS: &[(&str, &[&str])] = &[
    ("base: tunables and the log shim", &["config", "log"]),
    ("hardware descriptions", &["hw"]),
    ("commands: encoder, then decoder", &["cmd", "decode"]),
    ("fences and timelines, then memory", &["sync", "mem"]),
    ("platform traits, then the ivshmem binding", &["platform", "ivshmem"]),
    ("hang reports and trace", &["debug"]),
    ("ring, IB pool, device storage", &["ring", "ibpool", "storage"]),
    ("submission and wait errors (and their former name)", &["error", "queue"]),
    ("the device core", &["engine"]),
    ("the two modes", &["direct", "kernel"]),
    ("loom probes", &["loom_probe"]),
];

/// (layer index, position in the layer) of a top-level module.
fn rank(module: &str) -> Option<(usize, usize)> {
    LAYERS
        .iter()
        .enumerate()
        .find_map(|(l, (_, mods))| mods.iter().position(|m| *m == module).map(|p| (l, p)))
}

/// `code` without comments, string and character literals (each replaced
/// by spaces, newlines kept so lines still count).
fn strip(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || c[i - 1] == 'b')
            && matches!(next, Some('"') | Some('#'))
            && c[i + 1..].iter().find(|&&h| h != '#') == Some(&'"')
        {
            // A raw string: r"…", r#"…"#, br"…".
            let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
            let mut j = i + 2 + hashes;
            while j < c.len()
                && !(c[j] == '"' && c[j + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes)
            {
                j += 1;
            }
            for &ch in &c[i..(j + 1 + hashes).min(c.len())] {
                blank(&mut out, ch);
            }
            i = j + 1 + hashes;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' && next == Some('\\') {
            // An escaped character literal: '\n', '\'', '\u{…}'.
            let mut j = i + 2;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            for &ch in &c[i..(j + 1).min(c.len())] {
                blank(&mut out, ch);
            }
            i = j + 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            // A character literal 'x' (a lifetime has no closing quote).
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// A token of stripped code and its line.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other(char),
}

fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric()
            || ch == '_'
            || (ch == '$' && c.get(i + 1).is_some_and(|n| n.is_alphabetic()))
        {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().filter(|&&x| x != '$').collect();
            out.push((Tok::Ident(word), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((
                match ch {
                    '{' => Tok::Open,
                    '}' => Tok::Close,
                    ',' => Tok::Comma,
                    _ => Tok::Other(ch),
                },
                line,
            ));
            i += 1;
        }
    }
    out
}

/// The first segments of the paths that start at `toks[at]` (an
/// identifier, or a brace group of paths): for `engine::Foo` `engine`, for
/// `{engine::Foo, ring::{A, B}}` `engine` and `ring`.
fn first_segments(toks: &[(Tok, usize)], at: usize, found: &mut Vec<String>) {
    match toks.get(at) {
        Some((Tok::Ident(w), _)) => found.push(w.clone()),
        Some((Tok::Open, _)) => {
            let mut depth = 0usize;
            let mut item_start = false;
            for (k, (t, _)) in toks.iter().enumerate().skip(at) {
                if depth == 1 && item_start && !matches!(t, Tok::Close | Tok::Comma) {
                    first_segments(toks, k, found);
                    item_start = false;
                }
                match t {
                    Tok::Open => {
                        depth += 1;
                        item_start = depth == 1;
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Comma if depth == 1 => item_start = true,
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// Every crate-root module that the code of module `path` (its file's
/// module path, e.g. `["engine", "submit"]`) names, with the line.
fn imports(code: &str, path: &[String]) -> Vec<(String, usize)> {
    let toks = tokens(&strip(code));
    let mut out = Vec::new();
    // Inline modules (`mod tests { … }`) deepen the path `super` starts from.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let ident = |k: usize| match toks.get(k) {
        Some((Tok::Ident(w), _)) => Some(w.as_str()),
        _ => None,
    };
    let sep = |k: usize| matches!(toks.get(k), Some((Tok::PathSep, _)));
    for k in 0..toks.len() {
        match &toks[k].0 {
            Tok::Open => {
                if k >= 2 && ident(k - 2) == Some("mod") {
                    if let Some(name) = ident(k - 1) {
                        inline.push((name.to_string(), depth));
                    }
                }
                depth += 1;
            }
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "crate" && sep(k + 1) && !(k >= 1 && sep(k - 1)) => {
                let mut found = Vec::new();
                first_segments(&toks, k + 2, &mut found);
                out.extend(found.into_iter().map(|m| (m, toks[k].1)));
            }
            Tok::Ident(w) if w == "super" && !(k >= 1 && sep(k - 1)) => {
                let mut n = 0;
                let mut j = k;
                while ident(j) == Some("super") && sep(j + 1) {
                    n += 1;
                    j += 2;
                }
                let here: Vec<&String> = path.iter().chain(inline.iter().map(|(m, _)| m)).collect();
                if n > 0 && n >= here.len() {
                    // Up to the crate root: the next segment names the module.
                    let mut found = Vec::new();
                    first_segments(&toks, j, &mut found);
                    out.extend(found.into_iter().map(|m| (m, toks[k].1)));
                }
            }
            _ => {}
        }
    }
    out
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file");
    if last != "mod.rs" && last != "lib.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The modules lib.rs declares (`mod x;`, `mod x { … }`, with any
/// visibility and attributes).
fn declared(lib: &str) -> BTreeSet<String> {
    let toks = tokens(&strip(lib));
    let mut depth = 0;
    let mut out = BTreeSet::new();
    for k in 0..toks.len() {
        match &toks[k].0 {
            Tok::Open => depth += 1,
            Tok::Close => depth -= 1,
            Tok::Ident(w) if w == "mod" && depth == 0 => {
                if let Some((Tok::Ident(name), _)) = toks.get(k + 1) {
                    out.insert(name.clone());
                }
            }
            _ => {}
        }
    }
    out
}

/// Every import of a module from one above it (or from a later one of its
/// own layer), as `file:line: …` lines.
fn back_arrows(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for f in &files {
        let path = module_path(src, f);
        // lib.rs, the root: its inline modules are checked below.
        let Some(from_name) = path.first().cloned() else { continue };
        let from = rank(&from_name).unwrap_or_else(|| panic!("module {from_name} is in no layer of LAYERS"));
        let code = std::fs::read_to_string(f).expect("readable source");
        for (m, line) in imports(&code, &path) {
            if m == "self" || m == "*" {
                continue;
            }
            let Some(to) = rank(&m) else {
                bad.push(format!(
                    "{}:{line}: crate::{m} is no module: name the module it lives in",
                    f.display()
                ));
                continue;
            };
            if m != from_name && to > from {
                bad.push(format!(
                    "{}:{line}: {from_name} (layer {}) imports {m} (layer {})",
                    f.display(),
                    LAYERS[from.0].0,
                    LAYERS[to.0].0
                ));
            }
        }
    }
    // lib.rs's inline modules (a deprecated alias module, say).
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    bad.extend(inline_lib_back_arrows(&lib));
    bad
}

/// The back-arrows of the modules written inline in lib.rs.
fn inline_lib_back_arrows(lib: &str) -> Vec<String> {
    let toks = tokens(&strip(lib));
    let mut bad = Vec::new();
    let mut k = 0;
    while k + 2 < toks.len() {
        if let (Tok::Ident(kw), Tok::Ident(name), Tok::Open) = (&toks[k].0, &toks[k + 1].0, &toks[k + 2].0) {
            if kw == "mod" {
                let from = rank(name).unwrap_or_else(|| panic!("module {name} is in no layer of LAYERS"));
                // Its body: up to the matching brace.
                let mut depth = 0;
                let mut end = k + 2;
                for (j, (t, _)) in toks.iter().enumerate().skip(k + 2) {
                    match t {
                        Tok::Open => depth += 1,
                        Tok::Close => {
                            depth -= 1;
                            if depth == 0 {
                                end = j;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                for j in k + 3..end {
                    let root =
                        toks[j].0 == Tok::Ident("crate".into()) || toks[j].0 == Tok::Ident("super".into());
                    if root && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::PathSep) {
                        let mut found = Vec::new();
                        first_segments(&toks, j + 2, &mut found);
                        for m in found {
                            if let Some(to) = rank(&m) {
                                if m != *name && to > from {
                                    bad.push(format!("lib.rs:{}: {name} imports {m}", toks[j].1));
                                }
                            }
                        }
                    }
                }
                k = end;
            }
        }
        k += 1;
    }
    bad
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_module_is_in_one_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let declared = declared(&lib);
    let listed: BTreeSet<String> = LAYERS.iter().flat_map(|(_, m)| m.iter().map(|s| s.to_string())).collect();
    assert_eq!(declared, listed, "lib.rs's modules and the layer table differ");
}

#[test]
fn no_module_imports_one_above_it() {
    let bad = back_arrows(&src());
    assert!(
        bad.is_empty(),
        "imports that run up the layers (docs/architecture.md, \"Layers\"):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_scanner_sees_every_form_of_path() {
    let p = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let names = |code: &str, path: &[&str]| -> Vec<String> {
        imports(code, &p(path)).into_iter().map(|(m, _)| m).collect()
    };
    assert_eq!(names("use crate::engine::Foo;", &["ring"]), ["engine"]);
    assert_eq!(
        names("use crate::{engine::Foo, ring::{A, B}, self as c};", &["hw"]),
        ["engine", "ring", "self"]
    );
    assert_eq!(names("use crate::{{engine::{X}}, {mem::{Y, Z}}};", &["hw"]), ["engine", "mem"]);
    assert_eq!(names("fn f() { let x = crate::engine::Foo::new(); }", &["hw"]), ["engine"]);
    assert_eq!(names("pub(in crate::direct) fn f() {}", &["hw"]), ["direct"]);
    assert_eq!(names("macro_rules! m { () => { $crate::engine::x() } }", &["log"]), ["engine"]);
    // `super` from a nested file reaches the root after its depth.
    assert_eq!(names("use super::super::engine::X;", &["sync", "history"]), ["engine"]);
    assert_eq!(names("use super::fence::X;", &["sync", "history"]), Vec::<String>::new());
    assert_eq!(names("use super::engine::X;", &["ring"]), ["engine"]);
    // Inside an inline module `super` is that module's parent.
    assert_eq!(names("mod tests { use super::*; use super::super::engine::X; }", &["ring"]), ["engine"]);
    assert_eq!(names("mod tests { use super::X; }", &["ring"]), Vec::<String>::new());
    // Comments, doc comments, strings and characters are not code.
    let quiet = "// crate::engine\n/// [`crate::engine::X`]\n/* crate::engine /* nested */ crate::engine */\n\
                 let s = \"crate::engine\"; let r = r#\"crate::engine\"#; let c = '\"'; fn f<'a>(x: &'a u8) {}";
    assert_eq!(names(quiet, &["hw"]), Vec::<String>::new());
    // …and code after them is seen again, with its line.
    assert_eq!(imports("let c = '{';\n// x\nuse crate::ring::R;", &p(&["hw"])), [("ring".to_string(), 3)]);
    assert_eq!(names("let s = \"a\\\"b\"; use crate::ring::R;", &["hw"]), ["ring"]);
    // A path that only contains `crate` further on is not a crate path.
    assert_eq!(names("use other::crate_like::engine;", &["hw"]), Vec::<String>::new());
}

#[test]
fn a_back_arrow_is_reported() {
    let dir = std::env::temp_dir().join(format!("umd-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sync")).expect("temp dir");
    std::fs::write(
        dir.join("lib.rs"),
        "pub mod sync;\npub mod engine;\npub mod config {\n    pub use super::engine::X;\n}\n",
    )
    .expect("write");
    std::fs::write(dir.join("sync/mod.rs"), "pub mod history;\n").expect("write");
    std::fs::write(dir.join("sync/history.rs"), "// fine\nconst N: usize = crate::engine::queue::HISTORY;\n")
        .expect("write");
    std::fs::write(dir.join("engine.rs"), "use crate::sync::history;\n").expect("write");
    let bad = back_arrows(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].ends_with("history.rs:2: sync (layer fences and timelines, then memory) imports engine (layer the device core)"), "{bad:?}");
    assert_eq!(bad[1], "lib.rs:4: config imports engine");
}
