"""Code-tree fingerprints: which files make up the code, and their SHA-256.

Standard library only: this module also runs on the hosts (inside the check
script corral sends there), so the coordinator and every host walk the tree
with exactly the same rules.

What belongs to the tree: every regular file and symlink under the root,
except what ``.gitignore`` and ``.corralignore`` files exclude (each applies to
its own directory and below, git's rules: last match wins, ``!`` re-includes,
a trailing ``/`` matches directories only, a ``/`` elsewhere anchors the pattern
to the file's directory, ``**`` spans directories; an excluded directory is not
entered) and the built-in :data:`DEFAULT_IGNORES` (VCS metadata, bytecode,
virtualenvs, a top-level ``checkpoints/``). Symlinks are recorded by their target, never followed.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

IGNORE_FILES = (".gitignore", ".corralignore")
DEFAULT_IGNORES = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "/checkpoints/",  # training output at the top of a tree is not code
    ".corral-write-test-*",  # the pre-flight's probe of a checkpoint dir inside the tree
    ".corral-shared-check-*",  # the pre-flight's marker in a shared data path inside it
)
MAX_FILES = 100_000
_CHUNK = 1 << 20


@dataclass(frozen=True)
class IgnoreRule:
    """One gitignore pattern, compiled, relative to the directory of its file."""

    base: str  # directory of the ignore file, relative to the root ("" for the root)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    source: str  # "path/.gitignore:LINE" (for error messages and tests)

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` (relative to the tree root) matches this rule."""
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        return self.regex.fullmatch(rel) is not None


def _translate(pattern: str) -> str:
    """A gitignore glob (no leading/trailing slash handling) to a regex."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_ignore(text: str, base: str = "", source: str = "") -> list[IgnoreRule]:
    """The rules of one ignore file whose directory is ``base`` (relative to the root)."""
    rules: list[IgnoreRule] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate or line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        regex = _translate(line)
        if not anchored:
            regex = "(?:.*/)?" + regex
        rules.append(
            IgnoreRule(
                base=base,
                regex=re.compile(regex, re.DOTALL),
                negate=negate,
                dir_only=dir_only,
                source=f"{source}:{lineno}" if source else f"line {lineno}",
            )
        )
    return rules


def is_ignored(rules: Sequence[IgnoreRule], rel: str, is_dir: bool) -> bool:
    """git's rule: the last matching pattern decides."""
    ignored = False
    for rule in rules:
        if rule.negate == ignored and rule.matches(rel, is_dir):
            ignored = not rule.negate
    return ignored


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (a symlink: of ``link:`` + its target)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return hashlib.sha256(b"link:" + os.fsencode(os.readlink(path))).hexdigest()
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Manifest:
    """The files of a code tree and their SHA-256 (``files`` maps POSIX relative paths)."""

    root: str
    files: dict[str, str] = field(default_factory=dict)
    size: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # unreadable paths -> why
    truncated: bool = False  # more than MAX_FILES files: only the first are listed

    @property
    def digest(self) -> str:
        """One SHA-256 over every (path, hash) pair, in path order."""
        return tree_digest(self.files)

    def to_json(self) -> dict[str, object]:
        """A JSON-able form (what hosts send back)."""
        return {
            "root": self.root,
            "files": self.files,
            "size": self.size,
            "errors": self.errors,
            "truncated": self.truncated,
            "digest": self.digest,
        }


def tree_digest(files: dict[str, str]) -> str:
    """The digest of a ``{path: sha256}`` mapping."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path]}\n".encode())
    return digest.hexdigest()


def walk(
    root: str, *, extra_ignores: Iterable[str] = (), max_files: int = MAX_FILES
) -> tuple[list[str], dict[str, str], bool]:
    """Relative paths of the tree's files in walk order, unreadable paths, and
    whether the walk stopped at ``max_files``."""
    base_rules = parse_ignore("\n".join([*DEFAULT_IGNORES, *extra_ignores]), "", "built-in")
    files: list[str] = []
    errors: dict[str, str] = {}
    stack: list[tuple[str, list[IgnoreRule]]] = [("", base_rules)]
    while stack:
        rel_dir, inherited = stack.pop()
        abs_dir = os.path.join(root, rel_dir) if rel_dir else root
        rules = list(inherited)
        for name in IGNORE_FILES:
            path = os.path.join(abs_dir, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            src = f"{rel_dir}/{name}" if rel_dir else name
            rules.extend(parse_ignore(text, rel_dir, src))
        try:
            entries = sorted(os.scandir(abs_dir), key=lambda e: e.name)
        except OSError as exc:
            errors[rel_dir or "."] = exc.strerror or str(exc)
            continue
        subdirs: list[str] = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_ignored(rules, rel, is_dir):
                continue
            if is_dir:
                subdirs.append(rel)
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                if len(files) >= max_files:
                    return files, errors, True
                files.append(rel)
        stack.extend((d, rules) for d in reversed(subdirs))
    return files, errors, False


def build_manifest(
    root: str, *, extra_ignores: Iterable[str] = (), max_files: int = MAX_FILES
) -> Manifest:
    """Walk ``root`` and hash every file that belongs to the code tree."""
    root = os.path.abspath(os.path.expanduser(root))
    paths, errors, truncated = walk(root, extra_ignores=extra_ignores, max_files=max_files)
    manifest = Manifest(root=root, errors=errors, truncated=truncated)
    for rel in paths:
        full = os.path.join(root, rel)
        try:
            manifest.files[rel] = file_digest(full)
            manifest.size += os.lstat(full).st_size
        except OSError as exc:
            manifest.errors[rel] = exc.strerror or str(exc)
    return manifest


def diff_manifests(
    reference: dict[str, str], other: dict[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """(changed, missing from ``other``, extra in ``other``), each sorted."""
    changed = sorted(p for p in reference if p in other and other[p] != reference[p])
    missing = sorted(p for p in reference if p not in other)
    extra = sorted(p for p in other if p not in reference)
    return changed, missing, extra


def filter_files(files: dict[str, str], extra_ignores: Iterable[str]) -> dict[str, str]:
    """``files`` without the paths that ``extra_ignores`` (gitignore patterns,
    relative to the root) exclude: what a walk with those ignores would have kept."""
    patterns = [p for p in extra_ignores if p.strip()]
    if not patterns:
        return dict(files)
    rules = parse_ignore("\n".join(patterns), "", "extra")
    kept: dict[str, str] = {}
    excluded_dirs: dict[str, bool] = {}
    for path, sha in files.items():
        parts = path.split("/")
        hidden = False
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent not in excluded_dirs:
                excluded_dirs[parent] = is_ignored(rules, parent, True)
            if excluded_dirs[parent]:
                hidden = True
                break
        if not hidden and not is_ignored(rules, path, False):
            kept[path] = sha
    return kept
