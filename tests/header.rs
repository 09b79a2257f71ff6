//! The committed C header must be exactly what cbindgen generates from src/ffi.

#[test]
fn committed_header_is_up_to_date() {
    let generated = std::fs::read_to_string(env!("MLXRT_GENERATED_HEADER")).expect("generated header");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/mlxrt.h")).unwrap_or_default();
    assert!(
        generated == committed,
        "include/mlxrt.h is stale: run scripts/update-header.sh and commit the result"
    );
}

/// Every function the header declares is exercised by the C ABI test
/// (tests/c/test_abi.c), so a new function cannot ship untested.
#[test]
fn every_header_function_is_called_from_the_c_test() {
    let root = env!("CARGO_MANIFEST_DIR");
    let header = std::fs::read_to_string(format!("{root}/include/mlxrt.h")).unwrap();
    let test = std::fs::read_to_string(format!("{root}/tests/c/test_abi.c")).unwrap();
    // Declarations start unindented: `RET mlxrt_name(` (or `RET *mlxrt_name(`).
    let declared: Vec<&str> = header
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('#') && !l.starts_with("typedef"))
        .filter_map(|l| {
            let end = l.find('(')?;
            let start = l[..end].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
            let name = &l[start..end];
            name.starts_with("mlxrt_").then_some(name)
        })
        .collect();
    assert!(declared.len() >= 25, "found only {} declarations: {declared:?}", declared.len());
    let untested: Vec<&&str> = declared.iter().filter(|f| !test.contains(&format!("{f}("))).collect();
    assert!(untested.is_empty(), "header functions not called in tests/c/test_abi.c: {untested:?}");
}

/// The names a C header defines at file scope: macros, struct/enum tags,
/// typedefs, enum values and functions (enough C for cbindgen's output).
fn defined_names(header: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let last_ident = |s: &str| -> String {
        let s = s.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        let start = s.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        s[start..].to_string()
    };
    // Comments out.
    let mut code = String::new();
    let mut rest = header;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else {
            let c = rest.chars().next().unwrap();
            code.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    let mut names = Vec::new();
    // Macros; other directives and C++'s `extern "C"` braces are dropped.
    let mut c = String::new();
    for line in code.lines() {
        let t = line.trim_start();
        if let Some(d) = t.strip_prefix("#define") {
            names.push(ident(d.trim_start()));
        } else if !t.starts_with('#') && !t.contains("extern \"C\"") {
            c.push_str(line);
            c.push('\n');
        }
    }
    // Tags, wherever they appear.
    for kw in ["struct ", "enum "] {
        for (i, _) in c.match_indices(kw) {
            if c[..i].ends_with(|ch: char| ch.is_ascii_alphanumeric() || ch == '_') {
                continue;
            }
            names.push(ident(c[i + kw.len()..].trim_start()));
        }
    }
    // Brace bodies out; enum bodies give their values.
    let mut flat = String::new();
    let mut rest = c.as_str();
    while let Some(open) = rest.find('{') {
        let close = open + rest[open..].find('}').expect("unbalanced braces");
        let is_enum = rest[..open].rfind(';').map_or(&rest[..open], |i| &rest[i..open]).contains("enum ");
        if is_enum {
            for item in rest[open + 1..close].split(',') {
                let v = ident(item.trim_start());
                if !v.is_empty() {
                    names.push(v);
                }
            }
        }
        flat.push_str(&rest[..open]);
        rest = &rest[close + 1..];
    }
    flat.push_str(rest);
    // Typedefs and function declarations.
    for stmt in flat.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        if stmt.starts_with("typedef") {
            match stmt.find("(*") {
                Some(i) => names.push(ident(stmt[i + 2..].trim_start())),
                None => names.push(last_ident(stmt)),
            }
        } else if let Some(i) = stmt.find('(') {
            names.push(last_ident(&stmt[..i]));
        }
    }
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

#[test]
fn defined_names_reads_every_kind_of_declaration() {
    let names = defined_names(
        "/* c */\n#define MAX_TOP 20\n#if X\n: int32_t\n#endif\nenum Kind { A = 1, B = 2, };\n\
         typedef struct Opaque Opaque;\ntypedef struct S { int field; } S2;\n\
         typedef void (*cb)(void *ud);\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\
         const char *f(const struct S *s, int n); // f\nvoid g(void);\n",
    );
    assert_eq!(names, ["A", "B", "Kind", "MAX_TOP", "Opaque", "S", "S2", "cb", "f", "g"]);
}

/// A host includes mlxrt.h next to its own code: every name the header
/// defines is mlxrt_/MLXRT_ prefixed (no internals such as `MAX_TOP`).
#[test]
fn every_header_name_is_prefixed() {
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/mlxrt.h")).unwrap();
    let names = defined_names(&header);
    for known in ["MLXRT_H", "MLXRT_STATUS_OK", "MLXRT_EVENT_KIND_TOOL_CALL", "mlxrt_status", "mlxrt_event_fn", "mlxrt_engine_config", "mlxrt_stream_free"] {
        assert!(names.iter().any(|n| n == known), "did not find {known} in {names:?}");
    }
    let bad: Vec<&String> = names.iter().filter(|n| !n.starts_with("mlxrt_") && !n.starts_with("MLXRT_")).collect();
    assert!(bad.is_empty(), "include/mlxrt.h defines names without the mlxrt_/MLXRT_ prefix: {bad:?}");
}
