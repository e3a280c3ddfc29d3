//! Which top-level modules of a crate name which others (`crate::x` paths and
//! `use crate::{x, ..}` groups), and the cycles among them. The eBPF crate is
//! kept free of cycles: its map definitions depend on no feature module, and a
//! feature module reaches another only downward (the test below).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// Module -> the crate's other top-level modules it names. `main.rs` and
/// `lib.rs` are the root, left out (they declare every module).
pub(crate) fn graph(src: &Path) -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    collect_rs(src, &mut files)?;
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap_or(f);
        let Some(first) = rel.components().next() else {
            continue;
        };
        let top = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "main" || top == "lib" {
            continue;
        }
        let text = fs::read_to_string(f)?;
        let names = deps.entry(top.clone()).or_default();
        names.extend(named_modules(&text).into_iter().filter(|m| *m != top));
    }
    let modules: BTreeSet<String> = deps.keys().cloned().collect();
    for names in deps.values_mut() {
        names.retain(|m| modules.contains(m));
    }
    Ok(deps)
}

fn collect_rs(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let p = entry?.path();
        if p.is_dir() {
            collect_rs(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The first path segments after `crate::` in `text`, braces included
/// (`use crate::{a::B, c}` names `a` and `c`).
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: depth-1 segments before `::`, `,` or `}`.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && depth == 0 && !c.is_whitespace() => {
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            out.insert(name);
                        }
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The strongly connected components of more than one module (Tarjan).
pub(crate) fn cycles(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        deps: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let deps = s.deps;
        for w in deps.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        deps,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in deps.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_paths_name_their_first_segment() {
        let text = "use crate::{\n    maps::{A, B},\n    l3::parse,\n    counters,\n};\n\
                    let x = crate::nat::snat(ctx);";
        let got: Vec<String> = named_modules(text).into_iter().collect();
        assert_eq!(got, ["counters", "l3", "maps", "nat"]);
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        let g = |edges: &[(&str, &str)]| {
            let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                m.entry((*a).into()).or_default().insert((*b).into());
                m.entry((*b).into()).or_default();
            }
            m
        };
        assert!(cycles(&g(&[("a", "b"), ("b", "c")])).is_empty());
        assert_eq!(
            cycles(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
            vec![vec!["a".to_string(), "b".into(), "c".into()]]
        );
    }

    /// The eBPF crate's modules name each other without a cycle (issue 51:
    /// the map definitions used to import three feature modules' types).
    #[test]
    fn the_ebpf_crate_has_no_import_cycle() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/sluice-ebpf/src");
        let g = graph(&src).unwrap();
        assert!(g.contains_key("maps") && g.contains_key("nat"), "{g:?}");
        assert!(g["maps"].is_empty(), "maps names {:?}", g["maps"]);
        assert_eq!(cycles(&g), Vec::<Vec<String>>::new(), "{g:#?}");
    }
}
