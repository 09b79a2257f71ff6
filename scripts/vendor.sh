#!/usr/bin/env bash
# Refreshes vendor/, the cargo local registry that .cargo/config.toml puts in
# place of the public registry, so that `cargo build --offline` works from a clean
# checkout with an empty cargo home. Run it (online) after Cargo.lock or
# fuzz/Cargo.lock changes, then commit vendor/.
#
# vendor/ holds every registry package of both lockfiles, Windows- and
# wasm-only crates included: build.rs runs cbindgen, whose `cargo metadata`
# needs them all.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/vendor"
MANIFESTS=(Cargo.toml fuzz/Cargo.toml)

# Cargo reads .cargo/config.toml from the working directory upwards, so from
# outside the repository it fetches from the real registry, not from vendor/.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
for m in "${MANIFESTS[@]}"; do
    cargo fetch --locked --manifest-path "$ROOT/$m"
done

python3 - "$ROOT" "$OUT" "${CARGO_HOME:-$HOME/.cargo}" "${MANIFESTS[@]}" <<'EOF'
import glob, hashlib, io, json, os, shutil, sys, tarfile, tomllib

root, out, cargo_home, *manifests = sys.argv[1:]

# Registry packages pinned by the lockfiles: (name, version) -> checksum.
locked = {}
for m in manifests:
    with open(os.path.join(root, os.path.dirname(m), "Cargo.lock"), "rb") as f:
        for p in tomllib.load(f).get("package", []):
            if p.get("source", "").startswith("registry+"):
                locked[(p["name"], p["version"])] = p["checksum"]

def cached_crate(name, vers, cksum):
    for path in glob.glob(os.path.join(cargo_home, "registry/cache/*", f"{name}-{vers}.crate")):
        data = open(path, "rb").read()
        if hashlib.sha256(data).hexdigest() == cksum:
            return data
    sys.exit(f"vendor.sh: {name} {vers} is not in {cargo_home}/registry/cache with the locked checksum")

def index_path(name):
    n = name.lower()
    if len(n) <= 2:
        return os.path.join(str(len(n)), n)
    if len(n) == 3:
        return os.path.join("3", n[0], n)
    return os.path.join(n[:2], n[2:4], n)

def index_deps(manifest):
    """The index form of a packaged (normalized) Cargo.toml's dependencies."""
    deps = []
    def add(table, kind, target):
        for key, spec in (table or {}).items():
            if isinstance(spec, str):
                spec = {"version": spec}
            deps.append({
                "name": key,
                "req": spec.get("version", "*"),
                "features": spec.get("features", []),
                "optional": spec.get("optional", False),
                "default_features": spec.get("default-features", spec.get("default_features", True)),
                "target": target,
                "kind": kind,
                **({"package": spec["package"]} if "package" in spec else {}),
            })
    def add_all(t, target):
        add(t.get("dependencies"), "normal", target)
        add(t.get("build-dependencies", t.get("build_dependencies")), "build", target)
        add(t.get("dev-dependencies", t.get("dev_dependencies")), "dev", target)
    add_all(manifest, None)
    for target, t in manifest.get("target", {}).items():
        add_all(t, target)
    return deps

if os.path.isdir(out):
    shutil.rmtree(out)
os.makedirs(os.path.join(out, "index"))
entries = {}
for (name, vers), cksum in sorted(locked.items()):
    data = cached_crate(name, vers, cksum)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        manifest = tomllib.load(tar.extractfile(f"{name}-{vers}/Cargo.toml"))
    pkg = manifest["package"]
    entry = {"name": name, "vers": vers, "deps": index_deps(manifest), "cksum": cksum,
             "features": manifest.get("features", {}), "yanked": False, "links": pkg.get("links")}
    if isinstance(pkg.get("rust-version"), str):
        entry["rust_version"] = pkg["rust-version"]
    entries.setdefault(name, []).append(entry)
    with open(os.path.join(out, f"{name}-{vers}.crate"), "wb") as f:
        f.write(data)
for name, versions in entries.items():
    path = os.path.join(out, "index", index_path(name))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for e in versions:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
print(f"vendor/: {len(locked)} crates")
EOF
du -sh "$OUT"
