//! No module of any crate in the workspace imports a module that imports
//! it back, directly or around a longer loop. Loops make a file impossible
//! to read on its own (each needs the other to make sense) and were what
//! kept the large files from splitting; this keeps the ones taken apart
//! apart.
//!
//! The scan reads the sources as text: every `crate::` path outside a
//! comment (doc links included in what is skipped, since they import
//! nothing), with the crate root's re-exports followed to the module they
//! come from. A module's own submodules and ancestors do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's modules by path (`runtime::worker`; the root is ``), each
/// with its source text.
type Sources = BTreeMap<String, String>;

fn sources(src: &Path) -> Sources {
    fn walk(dir: &Path, src: &Path, out: &mut Sources) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path
                    .strip_prefix(src)
                    .expect("under src")
                    .with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&path).expect("a source file");
                out.insert(parts.join("::"), text);
            }
        }
    }
    let mut out = Sources::new();
    walk(src, src, &mut out);
    out
}

/// The text without `//` comments (doc comments included).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_end(s: &str) -> usize {
    s.find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len())
}

/// Every `crate::` path in `code`, as its segments; a group
/// (`crate::{a, b::c}`) gives one path per member.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for member in group.split(',') {
                let path = path_of(member.trim());
                if !path.is_empty() {
                    out.push(path);
                }
            }
        } else {
            out.push(path_of(rest));
        }
    }
    out
}

fn path_of(mut s: &str) -> Vec<String> {
    let mut path = Vec::new();
    loop {
        let end = ident_end(s);
        if end == 0 {
            break;
        }
        path.push(s[..end].to_owned());
        match s[end..].strip_prefix("::") {
            Some(rest) => s = rest,
            None => break,
        }
    }
    path
}

/// The root's `use`/`pub use` of modules and items: name to module.
fn root_aliases(sources: &Sources) -> BTreeMap<String, String> {
    let mut aliases = BTreeMap::new();
    let Some(root) = sources.get("") else {
        return aliases;
    };
    let root = code(root);
    // Two passes: module aliases first, then items re-exported through them.
    for pass in 0..2 {
        for statement in root.split(';') {
            let s = statement.trim();
            let Some(s) = s
                .strip_prefix("pub use ")
                .or_else(|| s.strip_prefix("use "))
            else {
                continue;
            };
            let Some((base, names)) = s.split_once("::") else {
                continue;
            };
            let base = aliases
                .get(base)
                .cloned()
                .unwrap_or_else(|| base.to_owned());
            if !sources.contains_key(&base) {
                continue;
            }
            let names = names.trim_start_matches('{').trim_end_matches('}');
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let module = format!("{base}::{name}");
                if pass == 0 && sources.contains_key(&module) {
                    aliases.insert(name.to_owned(), module);
                } else if pass == 1 && !aliases.contains_key(name) {
                    aliases.insert(name.to_owned(), base.clone());
                }
            }
        }
    }
    aliases
}

fn related(a: &str, b: &str) -> bool {
    a.is_empty()
        || b.is_empty()
        || a.starts_with(&format!("{b}::"))
        || b.starts_with(&format!("{a}::"))
}

/// Which module imports which (ancestors and descendants left out).
fn imports(sources: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    let aliases = root_aliases(sources);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in sources {
        for mut path in crate_paths(&code(text)) {
            if let Some(first) = path.first()
                && let Some(module) = aliases.get(first)
            {
                let mut resolved: Vec<String> = module.split("::").map(str::to_owned).collect();
                resolved.extend(path.drain(1..));
                path = resolved;
            }
            let target = (1..=path.len())
                .rev()
                .map(|k| path[..k].join("::"))
                .find(|p| sources.contains_key(p));
            if let Some(target) = target
                && target != *module
                && !related(module, &target)
            {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// The groups of modules that import each other around a loop.
fn loops(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reached {
        if !from_m.contains(*m) || found.iter().any(|g| g.contains(*m)) {
            continue;
        }
        let group = from_m
            .iter()
            .filter(|other| reached.get(other).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        found.push(group);
    }
    found
}

#[test]
fn the_scan_finds_a_loop_through_a_re_export() {
    let sources: Sources = [
        ("", "mod a;\nmod b;\npub use b::Thing;\n"),
        ("a", "use crate::Thing;\npub struct Other;\n"),
        ("b", "/// [`x`](crate::a::Other)\npub struct Thing;\n"),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_owned(), t.to_owned()))
    .collect();
    // The doc link imports nothing: no loop yet.
    assert!(loops(&imports(&sources)).is_empty());
    let mut with_loop = sources.clone();
    with_loop.insert(
        "b".to_owned(),
        "use crate::{a::Other};\npub struct Thing;\n".to_owned(),
    );
    let found = loops(&imports(&with_loop));
    assert_eq!(
        found,
        vec![BTreeSet::from(["a".to_owned(), "b".to_owned()])]
    );
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut scanned = BTreeMap::new();
    let mut found = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("the crates directory")
        .map(|e| e.expect("an entry").path())
        .collect();
    names.sort();
    for dir in names {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let name = dir
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let edges = imports(&sources(&src));
        scanned.insert(
            name.clone(),
            edges.values().map(BTreeSet::len).sum::<usize>(),
        );
        for group in loops(&edges) {
            let detail: Vec<String> = group
                .iter()
                .flat_map(|m| {
                    edges[m]
                        .iter()
                        .filter(|t| group.contains(*t))
                        .map(move |t| format!("{m} -> {t}"))
                })
                .collect();
            found.push(format!("{name}: {}", detail.join(", ")));
        }
    }
    // The scan saw the crates and their imports (not an empty walk).
    for (krate, least) in [
        ("parsley", 40),
        ("parsley-protocol", 20),
        ("parsley-kafka", 10),
    ] {
        assert!(
            scanned.get(krate).is_some_and(|n| *n >= least),
            "{krate}: {:?} imports found",
            scanned.get(krate)
        );
    }
    assert!(found.is_empty(), "modules importing each other: {found:#?}");
}
