"""Code-completion prompts for the Gemma 3 corpus (Python, JavaScript, C) and a held-out code slice from other
packages.

A prompt is the start of a real function: up to --context lines before it (imports, the enclosing class, the
previous function's end), its signature and, where there is one, its doc comment; the model writes the body.
Functions with fewer than 4 body lines are skipped. Sources are permissively licensed packages fetched with the
registries' own clients (`pip download --no-binary :all:`, `npm pack`), pinned; each license is copied to
`data/licenses/`. Training and held-out prompts come from *different packages* (`PACKAGES`), so no held-out
function, file or project is ever trained on; the existing code slice (`data/code_slice.jsonl`, GPTeacher) is
another source again.

    python recipes/gemma3/code_prompts.py   # -> data/code_prompts.jsonl (training), data/code_heldout.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# package -> (registry, version, language, split, license files inside the archive, source folder in it)
PACKAGES = {
    "more-itertools": ("pypi", "11.2.1", "python", "train", "LICENSE", "more_itertools"),
    "toolz": ("pypi", "1.2.0", "python", "train", "LICENSE.txt", "toolz"),
    "boltons": ("pypi", "26.2.0", "python", "train", "LICENSE", "boltons"),
    "networkx": ("pypi", "3.6.1", "python", "train", "LICENSE.txt", "networkx"),
    "lodash": ("npm", "4.18.1", "javascript", "train", "LICENSE", ""),
    "moment": ("npm", "2.31.0", "javascript", "train", "LICENSE", "src/lib"),
    "underscore": ("npm", "1.13.8", "javascript", "train", "LICENSE", "modules"),
    "psutil": ("pypi", "7.2.2", "c", "train", "LICENSE", "psutil"),
    "zstandard": ("pypi", "0.25.0", "c", "train", "LICENSE zstd/LICENSE", ""),
    "sortedcontainers": ("pypi", "2.4.0", "python", "heldout", "LICENSE", "sortedcontainers"),
    "validator": ("npm", "13.15.35", "javascript", "heldout", "LICENSE", "es/lib"),
    "ujson": ("pypi", "6.1.0", "c", "heldout", "LICENSE.txt", "src/ujson"),
}
EXTENSIONS = {"python": (".py",), "javascript": (".js",), "c": (".c",)}
JS_START = re.compile(r"^\s*(export\s+(default\s+)?)?(async\s+)?function\b.*\{\s*$|"
                      r"^\s*(const|let|var)\s+\w+\s*=\s*(async\s+)?(function\b.*|\(.*\)\s*=>\s*)\{\s*$|"
                      r"^\s+(static\s+|async\s+|get\s+|set\s+)?\w+\s*\([^;]*\)\s*\{\s*$")  # class methods
C_START = re.compile(r"^[A-Za-z_][\w\s\*]*\(")  # a definition's name at column 0 (its type may be on the line above)
C_TYPE = re.compile(r"^[A-Za-z_][\w\s\*]*$")
KEYWORDS = {"if", "for", "while", "switch", "return", "else", "do", "typedef", "catch", "sizeof"}


def first_word(line: str) -> str:
    match = re.match(r"\s*(\w+|#)", line)
    return match.group(1) if match else ""


def fetch(name: str, cache: Path) -> Path:
    """The unpacked source of `PACKAGES[name]` under `cache` (downloaded once with pip or npm)."""
    registry, version = PACKAGES[name][:2]
    folder = cache / f"{name}-{version}"
    if not folder.is_dir():
        download = cache / "downloads"
        download.mkdir(parents=True, exist_ok=True)
        if registry == "pypi":
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            "-d", str(download), f"{name}=={version}"], check=True)
            archive = next(p for p in download.iterdir()
                           if p.name.lower().replace("_", "-").startswith(f"{name}-{version}"))
        else:
            subprocess.run(["npm", "pack", "--silent", f"{name}@{version}"], cwd=download, check=True,
                           stdout=subprocess.DEVNULL)
            archive = download / f"{name}-{version}.tgz"
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
    entries = list(folder.iterdir())  # sdists and npm packs hold one top folder
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else folder


def python_starts(lines: list[str]) -> list[tuple[int, int, int]]:
    """(first line, last line of the signature + docstring, last body line) of each function, 0-based."""
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(
                getattr(node.body[0], "value", None), ast.Constant) and isinstance(node.body[0].value.value, str) \
                else node.body
            if body:
                out.append((first, body[0].lineno - 2, node.end_lineno - 1))
    return out


def brace_end(lines: list[str], start: int) -> int | None:
    """The line closing the brace block opened on line `start`, or None."""
    depth = 0
    for i in range(start, min(len(lines), start + 400)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth <= 0 and i > start:
            return i
    return None


def brace_starts(lines: list[str], language: str) -> list[tuple[int, int, int]]:
    """JavaScript / C functions: (first line, signature line ending in `{`, closing line)."""
    out = []
    for i, line in enumerate(lines):
        if language == "javascript":
            if not JS_START.match(line) or first_word(line) in KEYWORDS:
                continue
            sig = i
        else:
            if not C_START.match(line) or first_word(line) in KEYWORDS or line.rstrip().endswith(";"):
                continue
            sig = next((j for j in range(i, min(i + 6, len(lines))) if lines[j].rstrip().endswith("{")), None)
            if sig is None or any(lines[j].rstrip().endswith(";") for j in range(i, sig)):
                continue
        end = brace_end(lines, sig)
        first = i - 1 if language == "c" and i and C_TYPE.match(lines[i - 1]) else i
        if end is not None:
            out.append((first, sig, end))
    return out


def file_prompts(path: Path, language: str, context: int) -> list[str]:
    """Prompts of one source file: `context` lines before each function, its head; bodies of >= 4 lines."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    starts = python_starts(lines) if language == "python" else brace_starts(lines, language)
    prompts = []
    for first, head_end, end in starts:
        if end - head_end < 4:
            continue
        text = "\n".join(lines[max(0, first - context) : head_end + 1]) + "\n"
        if 40 <= len(text) <= 2500:
            prompts.append(text)
    return prompts


def package_prompts(name: str, cache: Path, context: int) -> list[str]:
    """Every prompt of a package's sources, deduplicated, in a fixed order."""
    language, sub = PACKAGES[name][2], PACKAGES[name][5]
    root = fetch(name, cache) / sub
    files = sorted(p for p in root.rglob("*") if p.suffix in EXTENSIONS[language] and "test" not in p.name
                   and ".min." not in p.name)
    seen, out = set(), []
    for path in files:
        for prompt in file_prompts(path, language, context):
            if prompt not in seen:
                seen.add(prompt)
                out.append(prompt)
    return out


def copy_licenses(name: str, cache: Path, licenses: Path) -> None:
    """The package's license files as data/licenses/<package>-LICENSE (a bundled library's: -<folder>-LICENSE)."""
    for file in PACKAGES[name][4].split():
        label = "-".join([name, *Path(file).parent.parts, "LICENSE"])
        shutil.copyfile(fetch(name, cache) / file, licenses / label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default="data_cache/code", help="where packages are downloaded (not committed)")
    parser.add_argument("--per-language", type=int, default=2000, help="training prompts per language")
    parser.add_argument("--heldout", type=int, default=10, help="held-out prompts per language")
    parser.add_argument("--context", type=int, default=12, help="lines kept before a function")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cache, rng = Path(args.cache), random.Random(args.seed)
    train, held = [], []
    for name, (_, version, language, split, _, _) in PACKAGES.items():
        copy_licenses(name, cache, Path("data/licenses"))
        prompts = package_prompts(name, cache, args.context)
        print(f"{name} {version} ({language}, {split}): {len(prompts)} prompts")
        rows = [{"prompt": p, "source": f"code-{language}", "package": f"{name}=={version}"} for p in prompts]
        (train if split == "train" else held).extend(rows)
    train_out, held_out = [], []
    for language in EXTENSIONS:
        mine = [r for r in train if r["source"] == f"code-{language}"]
        train_out += rng.sample(mine, min(args.per_language, len(mine)))
        theirs = [r for r in held if r["source"] == f"code-{language}"]
        held_out += [{"question_id": f"code-{language}-{i:03d}", "category": f"code-{language}", **r}
                     for i, r in enumerate(rng.sample(theirs, min(args.heldout, len(theirs))))]
    Path("data/code_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_out))
    Path("data/code_heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    print(f"{len(train_out)} training prompts, {len(held_out)} held-out prompts")


if __name__ == "__main__":
    main()
