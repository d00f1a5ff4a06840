#!/usr/bin/env python3
"""Fails when a test target of the workspace is run by no `cargo test` line of .ci/run, or
is never run with a feature its sources test for.

What must run: every target of every workspace package that `cargo test` runs (the lib,
bins, integration tests and examples whose `test` flag is set, per `cargo metadata`), and
for each `cfg(feature = "X")` its sources contain (in `#[cfg]`, `#![cfg]`, `#[cfg_attr]` or
`cfg!`, inside `all`/`any` too), a run with X enabled; for `not(feature = "X")`, a run with
X disabled. A target's sources are its root file and the modules it declares (`mod name;`,
`#[path]`), followed recursively.

What runs: each `cargo test` line of .ci/run (continuations joined), read for its packages
(`-p`/`--package`, `--workspace`/`--all` less `--exclude`, else the default members), its
features (`--features`/`-F`, `pkg/feature`, `--all-features`, `--no-default-features`, the
package's default feature and what its features imply), and its targets (`--lib`, `--bin`,
`--bins`, `--test`, `--tests`, `--example`, `--examples`, `--all-targets`, `--doc`; none:
every target with the `test` flag). A target whose `required-features` are not enabled is
not run. Test-name filters after `--` are not read: a line counts as running the target.

Usage: check-test-coverage.py [path/to/.ci/run]   (from anywhere inside the workspace)
Python 3 standard library only.
"""

import json
import os
import re
import shlex
import subprocess
import sys

# Flags of `cargo test` that take a value we do not use.
VALUE_FLAGS = {
    "--manifest-path", "-j", "--jobs", "--target-dir", "--profile", "--color",
    "--message-format", "--target", "--config", "-Z", "--timings", "--lockfile-path",
}


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


# ----------------------------------------------------------------------------- sources

CFG_START = re.compile(r"#!?\[\s*cfg(?:_attr)?\s*\(|\bcfg!\s*\(")
MOD_DECL = re.compile(
    r'((?:#\[\s*path\s*=\s*"([^"]+)"\s*\]\s*)?)(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;'
)


def strip_comments(text):
    """Removes // and /* */ comments (strings are left alone; good enough for cfg scans)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def balanced(text, start):
    """The text from `start` (just after an opening parenthesis) to its closing one."""
    depth = 1
    i = start
    while i < len(text) and depth:
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == '"':
            i = text.find('"', i + 1)
            if i < 0:
                return text[start:]
        i += 1
    return text[start:i - 1]


def feature_gates(expr):
    """(feature, negated) for each `feature = "X"` in a cfg expression."""
    gates = []
    stack = []  # names of the predicates we are inside (all / any / not / ...)
    tokens = re.finditer(r'([A-Za-z_][A-Za-z0-9_]*)\s*\(|\)|feature\s*=\s*"([^"]+)"', expr)
    for m in tokens:
        if m.group(2) is not None:
            negated = stack.count("not") % 2 == 1
            gates.append((m.group(2), negated))
        elif m.group(1) is not None:
            stack.append(m.group(1))
        elif stack:
            stack.pop()
    return gates


def module_files(root):
    """The root file of a target and every module file it declares, recursively."""
    seen = []
    todo = [root]
    while todo:
        path = os.path.normpath(todo.pop())
        if path in seen or not os.path.isfile(path):
            continue
        seen.append(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_comments(f.read())
        here = os.path.dirname(path)
        base = os.path.basename(path)
        sub = here if base in ("lib.rs", "main.rs", "mod.rs") else os.path.join(here, base[:-3])
        for m in MOD_DECL.finditer(text):
            explicit, name = m.group(2), m.group(3)
            if explicit:
                todo.append(os.path.join(here, explicit))
            else:
                todo.append(os.path.join(sub, name + ".rs"))
                todo.append(os.path.join(sub, name, "mod.rs"))
    return seen


def target_gates(src_path):
    gates = set()
    for path in module_files(src_path):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_comments(f.read())
        for m in CFG_START.finditer(text):
            gates.update(feature_gates(balanced(text, m.end())))
    return gates


# ------------------------------------------------------------------------------ CI lines

def cargo_test_lines(run_path):
    with open(run_path, encoding="utf-8") as f:
        raw = f.read()
    joined = re.sub(r"\\\n", " ", raw)
    lines = []
    for number, line in enumerate(joined.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError:
            continue
        for i in range(len(words) - 1):
            if words[i] == "cargo" and words[i + 1] == "test":
                lines.append((number, stripped, words[i + 2:]))
                break
    return lines


def parse_line(args):
    opt = {
        "packages": [], "workspace": False, "exclude": [], "features": [],
        "all_features": False, "no_default": False, "targets": [], "any_target_flag": False,
    }
    it = iter(args)
    for a in it:
        if a == "--":
            break
        value = None
        if "=" in a and a.startswith("--"):
            a, value = a.split("=", 1)
        elif a.startswith("-p") and len(a) > 2:
            a, value = "-p", a[2:]
        elif a.startswith("-F") and len(a) > 2:
            a, value = "-F", a[2:]

        def val():
            return value if value is not None else next(it, "")

        if a in ("-p", "--package"):
            opt["packages"].append(val())
        elif a in ("--workspace", "--all"):
            opt["workspace"] = True
        elif a == "--exclude":
            opt["exclude"].append(val())
        elif a in ("-F", "--features"):
            opt["features"] += [f for f in re.split(r"[ ,]+", val()) if f]
        elif a == "--all-features":
            opt["all_features"] = True
        elif a == "--no-default-features":
            opt["no_default"] = True
        elif a in ("--lib", "--bins", "--tests", "--examples", "--all-targets", "--doc",
                   "--benches"):
            opt["targets"].append((a, None))
            opt["any_target_flag"] = True
        elif a in ("--bin", "--test", "--example", "--bench"):
            opt["targets"].append((a, val()))
            opt["any_target_flag"] = True
        elif a in VALUE_FLAGS and value is None:
            next(it, None)
    return opt


def selected_targets(pkg, opt):
    targets = pkg["targets"]

    def kind(t):
        k = t["kind"][0]
        return "lib" if k in ("lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro") else k

    if not opt["any_target_flag"]:
        return [t for t in targets if t.get("test") and kind(t) in ("lib", "bin", "test", "example")]
    out = []
    for flag, name in opt["targets"]:
        for t in targets:
            k = kind(t)
            if (
                (flag == "--lib" and k == "lib")
                or (flag == "--bins" and k == "bin" and t.get("test"))
                or (flag == "--bin" and k == "bin" and t["name"] == name)
                or (flag == "--tests" and t.get("test") and k != "bench")
                or (flag == "--test" and k == "test" and t["name"] == name)
                or (flag == "--examples" and k == "example")
                or (flag == "--example" and k == "example" and t["name"] == name)
                or (flag == "--all-targets" and k != "bench")
            ):
                if t not in out:
                    out.append(t)
    return out


def enabled_features(pkg, opt):
    declared = pkg["features"]
    if opt["all_features"]:
        on = set(declared)
    else:
        on = set()
        if not opt["no_default"] and "default" in declared:
            on.add("default")
        for f in opt["features"]:
            if "/" in f:
                owner, feat = f.split("/", 1)
                if owner == pkg["name"]:
                    on.add(feat)
            elif f in declared:
                on.add(f)
    # What they imply within the package.
    todo = list(on)
    while todo:
        for implied in declared.get(todo.pop(), []):
            if "/" in implied or implied.startswith("dep:"):
                continue
            if implied not in on:
                on.add(implied)
                todo.append(implied)
    return on


# ---------------------------------------------------------------------------------- main

def main():
    run_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "run")
    meta = metadata()
    members = set(meta["workspace_members"])
    defaults = set(meta.get("workspace_default_members") or members)
    packages = {p["name"]: p for p in meta["packages"] if p["id"] in members}
    default_names = {p["name"] for p in meta["packages"] if p["id"] in defaults}

    # (package, target kind, target name) -> list of (line number, enabled features)
    runs = {}
    lines = cargo_test_lines(run_path)
    problems = []
    for number, text, args in lines:
        opt = parse_line(args)
        if opt["workspace"]:
            names = set(packages) - set(opt["exclude"])
        elif opt["packages"]:
            names = set(opt["packages"])
        else:
            names = default_names
        for name in sorted(names):
            pkg = packages.get(name)
            if pkg is None:
                problems.append(f".ci/run line {number}: no workspace package {name!r}: {text}")
                continue
            on = enabled_features(pkg, opt)
            for t in selected_targets(pkg, opt):
                if not set(t.get("required-features") or []) <= on:
                    continue
                runs.setdefault((name, t["kind"][0], t["name"]), []).append((number, on))
        for flag, tname in opt["targets"]:
            if tname is not None and not any(
                any(t["name"] == tname for t in packages[n]["targets"])
                for n in names if n in packages
            ):
                problems.append(f".ci/run line {number}: no target {tname!r} in {sorted(names)}")

    missing = []
    checked = 0
    for name, pkg in sorted(packages.items()):
        for t in pkg["targets"]:
            k = t["kind"][0]
            if not t.get("test") or k == "bench":
                continue
            if k not in ("lib", "rlib", "proc-macro", "bin", "test", "example"):
                continue
            checked += 1
            key = (name, k, t["name"])
            got = runs.get(key, [])
            where = f"{name} {k} {t['name']!r}"
            if not got:
                missing.append(f"{where}: run by no `cargo test` line")
                continue
            for feature, negated in sorted(target_gates(t["src_path"])):
                if feature not in pkg["features"]:
                    # A feature of another crate's cfg (a macro's expansion) or a typo.
                    missing.append(
                        f"{where}: tests for feature {feature!r}, which {name} does not declare"
                    )
                elif negated and not any(feature not in on for _, on in got):
                    missing.append(f"{where}: never run without feature {feature!r}")
                elif not negated and not any(feature in on for _, on in got):
                    missing.append(f"{where}: never run with feature {feature!r}")

    for p in problems:
        print(f"check-test-coverage: {p}", file=sys.stderr)
    for m in missing:
        print(f"check-test-coverage: {m}", file=sys.stderr)
    if problems or missing:
        print(
            f"check-test-coverage: {len(missing)} gap(s) in {checked} test targets; add a "
            "`cargo test` line to .ci/run for each",
            file=sys.stderr,
        )
        return 1
    print(f"check-test-coverage: {checked} test targets, every one run with every feature it "
          f"tests for, by {len(lines)} `cargo test` lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
