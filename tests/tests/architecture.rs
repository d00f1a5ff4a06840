//! The workspace's architecture, checked from its sources (DESIGN.md, "Layers and crates"):
//!
//! * within each library crate, the top-level modules form layers: no two of them import
//!   each other, directly or around a cycle;
//! * a transport crate depends on no other transport, and core on none;
//! * in the verbs crate, the public objects and the libibverbs provider (`ibv/`) import
//!   nothing from the soft provider (`soft/`), nor `soft/` from `ibv/`; only `device.rs`
//!   (`Device::open_with`) and the connection manager (`cm/`: the soft CM, and librdmacm
//!   on `ibv/` devices) name both; the soft engine imports no public object.
//!
//! "Imports" are what the code names: `crate::x` paths (in `use` or inline), `super::x` from
//! a top-level file, and `use crate::{x, ...}` groups. Comments and `#[cfg(test)]` items are
//! left out (tests may use anything).
#![allow(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

/// The library crates whose modules must form layers: every directory of the workspace
/// with `src/lib.rs`, but the test and tool crates.
fn library_crates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root())
        .expect("read the workspace")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("src/lib.rs").is_file() && p.join("Cargo.toml").is_file())
        .filter(|p| {
            !matches!(
                p.file_name().and_then(|n| n.to_str()),
                Some("tests" | "tools")
            )
        })
        .collect();
    v.sort();
    v
}

/// `s` without comments (line and block), strings kept as they are (paths in strings are
/// rare and harmless here).
fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' && i + 1 < b.len() {
                out.push(b[i] as char);
                out.push(b[i + 1] as char);
                i += 2;
                continue;
            }
            if b[i] == b'"' {
                in_str = false;
            }
            out.push(b[i] as char);
            i += 1;
        } else if b[i] == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'\'' && i + 2 < b.len() && b[i + 2] == b'\'' {
            // A char literal such as '"' or '{'.
            out.push_str("' '");
            i += 3;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// `s` (comments stripped) without its `#[cfg(test)]` items, and the names of the modules
/// declared under `#[cfg(test)]` as `mod x;` (whose files are left out too).
fn strip_tests(s: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(s.len());
    let mut test_mods = Vec::new();
    let mut rest = s;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        // The item: up to its `;` or its matching `}` (attributes in between included).
        let semi = after.find(';');
        let brace = after.find('{');
        match (semi, brace) {
            (Some(si), b) if b.is_none_or(|b| si < b) => {
                let item = after[..si].trim();
                if let Some(name) = item.split_whitespace().skip_while(|w| *w != "mod").nth(1) {
                    test_mods.push(name.to_string());
                }
                rest = &after[si + 1..];
            }
            (_, Some(bi)) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (i, c) in after[bi..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = bi + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => rest = "",
        }
    }
    out.push_str(rest);
    (out, test_mods)
}

/// The files among `files` that their parents declare under `#[cfg(test)]` as `mod x;`
/// (`x.rs` or `x/` beside a `mod.rs` or `lib.rs`, else in the directory named after the
/// parent).
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut test_files = BTreeSet::new();
    for f in files {
        let text = strip_comments(&std::fs::read_to_string(f).expect("read a source file"));
        let (_, test_mods) = strip_tests(&text);
        let owns_dir = f
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let base = if owns_dir {
            f.parent().map(Path::to_path_buf)
        } else {
            f.file_stem().and_then(|s| f.parent().map(|p| p.join(s)))
        };
        let Some(base) = base else { continue };
        for m in test_mods {
            test_files.insert(base.join(format!("{m}.rs")));
            test_files.insert(base.join(&m).join("mod.rs"));
            let d = base.join(&m);
            if d.is_dir() {
                let mut inner = Vec::new();
                collect_rs(&d, &mut inner);
                test_files.extend(inner);
            }
        }
    }
    test_files
}

/// The source files of top-level module `name` of the crate at `src` (its file, or its
/// directory), with test-only files left out.
fn module_files(src: &Path, name: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        files.push(file);
    }
    let dir = src.join(name);
    if dir.is_dir() {
        collect_rs(&dir, &mut files);
    }
    // Leave out files declared under `#[cfg(test)]` by their parent.
    let test_files = test_only_files(&files);
    files.retain(|f| !test_files.contains(f));
    files
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read a source directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect_rs(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules a crate's `lib.rs` declares.
fn top_modules(src: &Path) -> Vec<String> {
    let lib = strip_comments(&std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs"));
    let mut v = Vec::new();
    for line in lib.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| *w == "mod")
            && let Some(name) = words.get(i + 1)
            && name.ends_with(';')
        {
            v.push(name.trim_end_matches(';').to_string());
        }
    }
    v
}

/// The names the code of `text` (one file of top-level module `from`) takes from other
/// top-level modules of its crate: `crate::x`, `super::x` in a top-level file, and
/// `use crate::{x, y::z}` groups.
fn references(text: &str, top_level_file: bool, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut look = |prefix: &str| {
        let mut rest = text;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a, b::c}`: the first segment of each entry, at depth 0.
                let mut depth = 0usize;
                let mut start = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            found.insert(ident(group[start..i].trim()));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            found.insert(ident(group[start..i].trim()));
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
            } else {
                found.insert(ident(rest));
            }
        }
    };
    look("crate::");
    if top_level_file {
        look("super::");
    }
    found.retain(|m| modules.contains(m));
    found
}

/// The import graph of a crate's top-level modules: module -> modules it imports.
fn module_graph(krate: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let src = krate.join("src");
    let modules: BTreeSet<String> = top_modules(&src).into_iter().collect();
    let mut graph = BTreeMap::new();
    for m in &modules {
        let mut refs = BTreeSet::new();
        for f in module_files(&src, m) {
            let text = strip_comments(&std::fs::read_to_string(&f).expect("read a source file"));
            let (code, _) = strip_tests(&text);
            let top_level = f == src.join(format!("{m}.rs")) || f == src.join(m).join("mod.rs");
            refs.extend(references(&code, top_level, &modules));
        }
        refs.remove(m);
        graph.insert(m.clone(), refs);
    }
    graph
}

/// The cycles of a graph (its strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive (the graphs are small).
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// For a cycle, the imports that tie it (for the failure message).
fn describe(graph: &BTreeMap<String, BTreeSet<String>>, cycle: &[String]) -> String {
    let mut lines = Vec::new();
    for a in cycle {
        for b in &graph[a] {
            if cycle.contains(b) {
                lines.push(format!("{a} -> {b}"));
            }
        }
    }
    lines.join(", ")
}

#[test]
fn the_modules_of_every_library_crate_form_layers() {
    let crates = library_crates();
    assert!(
        crates.iter().any(|c| c.ends_with("transport-rc"))
            && crates.iter().any(|c| c.ends_with("verbs")),
        "the crates were not found: {crates:?}"
    );
    let mut failures = Vec::new();
    for krate in &crates {
        let graph = module_graph(krate);
        for c in cycles(&graph) {
            failures.push(format!(
                "{}: modules import each other in a cycle: {}",
                krate.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
                describe(&graph, &c)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The `rdmx-*` crates a crate depends on (normal dependencies).
fn dependencies(krate: &Path) -> BTreeSet<String> {
    let toml = std::fs::read_to_string(krate.join("Cargo.toml")).expect("read Cargo.toml");
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps
            && let Some(name) = line.split(['=', '.', ' ']).next()
            && name.starts_with("rdmx")
        {
            deps.insert(name.to_string());
        }
    }
    deps
}

#[test]
fn transports_depend_on_no_other_transport_and_core_on_none() {
    let transports: Vec<PathBuf> = library_crates()
        .into_iter()
        .filter(|c| {
            c.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("transport-"))
        })
        .collect();
    assert!(!transports.is_empty(), "no transport crate found");
    let names: BTreeSet<String> = transports
        .iter()
        .map(|c| {
            let n = c.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            format!("rdmx-{}", n.trim_start_matches("transport-"))
        })
        .collect();
    for t in &transports {
        let deps = dependencies(t);
        let bad: Vec<&String> = deps.intersection(&names).collect();
        assert!(
            bad.is_empty(),
            "{} depends on the transports {bad:?}",
            t.display()
        );
    }
    let core = dependencies(&root().join("core"));
    let bad: Vec<&String> = core.intersection(&names).collect();
    assert!(
        bad.is_empty(),
        "rdmx-core depends on the transports {bad:?}"
    );
    assert!(
        core.contains("rdmx-verbs"),
        "core's dependencies were not read: {core:?}"
    );
}

/// The code of every file under `dir` (relative to the verbs crate's `src`), comments and
/// tests left out, by path.
fn verbs_code(files: &[PathBuf]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|f| {
            let text = strip_comments(&std::fs::read_to_string(f).expect("read a source file"));
            (f.clone(), strip_tests(&text).0)
        })
        .collect()
}

#[test]
fn the_verbs_objects_are_provider_neutral() {
    let src = root().join("verbs/src");
    let modules: BTreeSet<String> = top_modules(&src).into_iter().collect();
    assert!(
        modules.contains("soft") && modules.contains("ibv"),
        "{modules:?}"
    );
    let mut failures = Vec::new();
    // (`super::` names a top-level module only from a top-level file.)
    let top_level = |f: &Path| {
        f.parent() == Some(src.as_path())
            || f.ends_with("mod.rs") && f.parent().and_then(Path::parent) == Some(src.as_path())
    };
    let names_module = |f: &Path, code: &str, m: &str| {
        let mods = [m.to_string()].into_iter().collect();
        !references(code, top_level(f), &mods).is_empty()
    };
    // The public objects and the provider interface: neither provider, but `device.rs`
    // (Device::open_with) names both, and the connection manager (`cm/`) speaks
    // RoCEv2-framed CM messages over its own UDP sockets with the soft provider's wire
    // module (the soft provider's CM) and, with the `ibverbs` feature, maps the same API
    // onto librdmacm for `ibv/` devices (`cm/rdmacm/`, which reaches the libibverbs
    // provider to move its QPs).
    for m in modules
        .iter()
        .filter(|m| !matches!(m.as_str(), "soft" | "ibv" | "device" | "cm"))
    {
        for (f, code) in verbs_code(&module_files(&src, m)) {
            for p in ["soft", "ibv"] {
                if names_module(&f, &code, p) {
                    failures.push(format!("{} imports {p}/", f.display()));
                }
            }
        }
    }
    for (f, code) in verbs_code(&module_files(&src, "ibv")) {
        if names_module(&f, &code, "soft") {
            failures.push(format!(
                "{} (libibverbs provider) imports soft/",
                f.display()
            ));
        }
    }
    // The soft provider: nothing of ibv/; its engine no public object.
    let objects = ["ah", "cq", "device", "pd", "provider", "qp", "srq", "xrc"];
    for (f, code) in verbs_code(&module_files(&src, "soft")) {
        if names_module(&f, &code, "ibv") {
            failures.push(format!("{} (soft provider) imports ibv/", f.display()));
        }
        if f.starts_with(src.join("soft/engine")) {
            for o in objects.iter().filter(|o| modules.contains(**o)) {
                if names_module(&f, &code, o) {
                    failures.push(format!("{} (soft engine) imports {o}", f.display()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_scanner_sees_what_it_must() {
    let mods: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let code = strip_comments(
        "use crate::a::X;\n// crate::c in a comment\nfn f() { crate::b::g(); }\nlet s = \"{\";",
    );
    assert_eq!(
        references(&code, false, &mods),
        ["a", "b"].iter().map(|s| s.to_string()).collect()
    );
    let code = strip_comments("use crate::{a::X, c::{Y, Z}};\nuse super::b;");
    assert_eq!(references(&code, true, &mods).len(), 3);
    assert_eq!(
        references(&code, false, &mods).len(),
        2,
        "super:: below the top level"
    );
    let (code, test_mods) = strip_tests(
        "fn f() {}\n#[cfg(test)]\nmod sim;\n#[cfg(test)]\nmod tests {\n use crate::c; fn g() { {} } }\nuse crate::a;",
    );
    assert_eq!(test_mods, vec!["sim".to_string()]);
    assert!(
        !code.contains("crate::c") && code.contains("crate::a"),
        "{code}"
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
}

/// The message-layer protocol runs on the worker's clock (virtual in a simulation): no
/// code of a transport or of the worker reads the host's clock, except for the deadlines of
/// the TCP side channel (rdmx-rc's `util::host_now`, rdmx-ud's `exchange.rs`) and the
/// worker's waits (application threads sleep real time: `worker/wait.rs`,
/// `worker/async_timer.rs`).
#[test]
fn the_protocol_reads_no_clock_but_the_workers() {
    let root = root();
    let allowed = [
        "transport-rc/src/util.rs",
        "transport-ud/src/exchange.rs",
        "core/src/worker/wait.rs",
        "core/src/worker/async_timer.rs",
    ];
    let mut files = Vec::new();
    collect_rs(&root.join("transport-rc/src"), &mut files);
    collect_rs(&root.join("transport-ud/src"), &mut files);
    collect_rs(&root.join("core/src/worker"), &mut files);
    let test_files = test_only_files(&files);
    files.retain(|f| !test_files.contains(f));
    let mut found = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&root)
            .unwrap_or(f)
            .to_string_lossy()
            .replace('\\', "/");
        if allowed.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let (code, _) = strip_tests(&strip_comments(&text));
        for needle in ["Instant::now", "SystemTime::now"] {
            if code.contains(needle) {
                found.push(format!("{rel}: {needle}"));
            }
        }
    }
    assert!(files.len() > 10, "the scan found too few files: {files:?}");
    assert!(
        found.is_empty(),
        "clock reads outside the worker's clock (use Cx::now / Worker::now): {found:?}"
    );
}
